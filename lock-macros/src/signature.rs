//! What the annotated function must look like, and which names its key may use.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::TokenStream;
use quote::{ToTokens, quote_spanned};
use syn::ext::IdentExt;
use syn::{FnArg, Ident, LitStr, Member, Pat, ReturnType, Signature, Type};

use crate::args::{Errors, edit_distance};
use crate::template::{Placeholder, Segment};

/// Checks that `sig` is an `async fn` returning a `Result`; every problem found is reported.
pub(crate) fn check(sig: &Signature, errors: &mut Errors) {
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "#[distributed_lock] cannot be used on a `const fn`: the lock is taken at run time with `.await`; remove `const` and write `async fn`",
        ));
    }
    // `const async fn` does not exist: the `const` error already says to write `async fn`.
    if sig.asyncness.is_none() && sig.constness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "#[distributed_lock] needs an `async fn`: the lock is taken with `.await`; write `async fn {}`, or take the lock by hand with `locker.lock(key).await` inside async code",
                sig.ident
            ),
        ));
    }
    match &sig.output {
        ReturnType::Default => errors.push(syn::Error::new(
            sig.paren_token.span.close(),
            "#[distributed_lock] needs a function returning `Result<T, E>` with `E: From<lock_core::LockError>`, so that busy, timeout and lease-lost errors can be returned; add a return type such as `-> Result<(), MyError>`",
        )),
        ReturnType::Type(_, ty) if !is_result(ty) => errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "#[distributed_lock] needs a return type of `Result<T, E>` with `E: From<lock_core::LockError>`, found `{}`; return `Result<{}, MyError>` (a type alias must be named `Result`)",
                compact(ty),
                compact(ty),
            ),
        )),
        ReturnType::Type(..) => {}
    }
}

/// `Result<..>`, `io::Result<..>`, `std::result::Result<..>`, `anyhow::Result<..>`, or any alias
/// named `Result`: the type checker verifies the rest.
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Group(g) => is_result(&g.elem),
        Type::Paren(p) => is_result(&p.elem),
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Result"),
        _ => false,
    }
}

/// A type as users write it, for messages (`Option<u32>`, not `Option < u32 >`).
fn compact(ty: &Type) -> String {
    let mut out = String::new();
    for token in ty.to_token_stream().to_string().split(' ') {
        let glue = token.starts_with(['<', '>', ',', ':', ')', ']'])
            || out.ends_with(['<', '&', '(', '[', ':']);
        if !glue && !out.is_empty() {
            out.push(' ');
        }
        out.push_str(token);
    }
    out
}

/// The names a key template may use: the receiver and parameters bound to a plain name.
pub(crate) struct Params {
    has_self: bool,
    /// By unraw'd name.
    named: BTreeMap<String, Ident>,
    /// Names bound inside pattern parameters (`(a, b): (u32, u32)`), with the parameter's
    /// type: not nameable.
    in_patterns: BTreeMap<String, String>,
}

impl Params {
    pub(crate) fn of(sig: &Signature) -> Self {
        let mut params = Params {
            has_self: false,
            named: BTreeMap::new(),
            in_patterns: BTreeMap::new(),
        };
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(_) => params.has_self = true,
                FnArg::Typed(typed) => match &*typed.pat {
                    Pat::Ident(p) => {
                        params
                            .named
                            .insert(p.ident.unraw().to_string(), p.ident.clone());
                    }
                    pat => {
                        let mut names = BTreeSet::new();
                        bindings(pat, &mut names);
                        let ty = compact(&typed.ty);
                        params
                            .in_patterns
                            .extend(names.into_iter().map(|n| (n, ty.clone())));
                    }
                },
            }
        }
        params
    }

    /// The arguments of the generated `format!`, one per placeholder, spanned at the key
    /// literal (so a missing `Display` is reported there). Every unknown name is reported.
    pub(crate) fn key_arguments(
        &self,
        key: &LitStr,
        segments: &[Segment],
        fn_name: &Ident,
        errors: &mut Errors,
    ) -> Vec<TokenStream> {
        segments
            .iter()
            .filter_map(|segment| match segment {
                Segment::Text(_) => None,
                Segment::Value(p) => errors.take(self.resolve(p, key, fn_name)),
            })
            .collect()
    }

    fn resolve(&self, p: &Placeholder, key: &LitStr, fn_name: &Ident) -> syn::Result<TokenStream> {
        let span = key.span();
        let error = |message: String| syn::Error::new(span, message);
        let root = if p.root == "self" {
            if !self.has_self {
                return Err(error(format!(
                    "`{{{}}}` in the key, but `{fn_name}` has no `self` parameter",
                    p.source
                )));
            }
            quote_spanned!(span=> self)
        } else {
            let name = p.root.strip_prefix("r#").unwrap_or(&p.root);
            if let Some(ident) = self.named.get(name) {
                let mut ident = ident.clone();
                ident.set_span(span);
                ident.into_token_stream()
            } else if let Some(ty) = self.in_patterns.get(name) {
                return Err(error(format!(
                    "`{name}` in the key is bound by a pattern parameter of `{fn_name}`, and a key can only name whole parameters and their fields: bind the parameter to a name (`value: {ty}`) and write its field in the key (`{{value.field}}`, or `{{value.0}}` for a tuple)"
                )));
            } else {
                return Err(error(self.unknown(name, fn_name)));
            }
        };
        let mut path = root;
        for field in &p.fields {
            let mut member: Member = syn::parse_str(field).map_err(|_| {
                error(format!(
                    "`{field}` in `{{{}}}` is not a field name (a keyword? write `r#{field}`)",
                    p.source
                ))
            })?;
            if let Member::Named(ident) = &mut member {
                ident.set_span(span);
            } else if let Member::Unnamed(index) = &mut member {
                index.span = span;
            }
            path = quote_spanned!(span=> #path.#member);
        }
        Ok(path)
    }

    fn unknown(&self, name: &str, fn_name: &Ident) -> String {
        let mut names: Vec<&str> = self.named.keys().map(String::as_str).collect();
        if self.has_self {
            names.insert(0, "self");
        }
        let closest = names
            .iter()
            .find(|n| close(name, n))
            .map(|n| format!("; did you mean `{n}`?"))
            .unwrap_or_default();
        let available = match names.as_slice() {
            [] => format!("`{fn_name}` has no named parameters"),
            [one] => format!("the key can use `{one}` and its fields"),
            many => {
                let list: Vec<String> = many.iter().map(|n| format!("`{n}`")).collect();
                format!("the key can use {} and their fields", list.join(", "))
            }
        };
        format!(
            "unknown name `{name}` in the key: it is not a parameter of `{fn_name}`{closest} ({available})"
        )
    }
}

/// The names a pattern binds.
fn bindings(pat: &Pat, out: &mut BTreeSet<String>) {
    match pat {
        Pat::Ident(p) => {
            out.insert(p.ident.unraw().to_string());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Reference(r) => bindings(&r.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Or(o) => o.cases.iter().for_each(|p| bindings(p, out)),
        Pat::Type(t) => bindings(&t.pat, out),
        _ => {}
    }
}

/// Whether `candidate` is a plausible intended spelling of `name`.
fn close(name: &str, candidate: &str) -> bool {
    let distance = edit_distance(name, candidate);
    distance <= 2 && distance < name.len().max(candidate.len())
}
