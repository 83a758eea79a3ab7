//! The expansion: the original function, its body run under the lock.
//!
//! ```text
//! #[attrs] vis async fn name<G>(params) -> Result<T, E> where .. {
//!     let key = format!("..", param.field, ..);          // borrows the parameters, moves nothing
//!     let request = Ok(locker_expr.lock(key))            // or global().map(|l| l.lock(key))
//!         .map(|request| request.wait(..).lease(..).fenced());
//!     ::lock_core::__private::run_locked(request, async move {
//!         if false { return <fake value of the declared return type>; }   // for `?` inference
//!         { original body }
//!     }, From::from).await                                // `From::from` spanned at `E`
//! }
//! ```
//!
//! With `idempotent` (or `idempotent = "7d"`) the helper is `run_idempotent`, which also takes
//! the codec of `T` and the TTL of the stored result:
//!
//! ```text
//!     ::lock_core::__private::run_idempotent(request,
//!         ::lock_core::__private::stored()                  // spanned at `T`
//!             .called_by({ let __lock_here = || ();         // the function's path,
//!                 function_path(&__lock_here) }),           //   from a closure's type name
//!         ::lock_core::DEFAULT_RESULT_TTL,                  // or Duration::from_millis(..)
//!         async move { .. }, From::from).await
//! ```
//!
//! The Ok/Err handling lives in `run_locked`, in lock-core, as tracing-attributes hands its
//! work to `Instrument`. Glue identifiers carry `Span::mixed_site()`: the body cannot see them
//! and they cannot capture the user's names. Key arguments carry the key literal's span, so a
//! parameter that is not `Display` is reported at the key; the `locker` expression keeps its
//! own span, so a value that is not a `Locker` is reported there; the `From::from` handed to
//! `run_locked` carries the span of `E` in the signature, so a missing `From<LockError>` is
//! reported at `E`; `stored()` carries the span of `T`, so a `T` that is not
//! `Serialize + DeserializeOwned` is reported at `T`.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, GenericArgument, ItemFn, PathArguments, ReturnType, Type};

use crate::args::{Args, Errors, Options};
use crate::signature::{self, Params};
use crate::template::Segment;

/// Expands `#[distributed_lock(attr)] item`. On any error: the item unchanged plus
/// `compile_error!`s, so the rest of the crate (and the IDE) still sees the function.
pub(crate) fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let options = errors
        .take(syn::parse2::<Args>(attr))
        .and_then(|args| args.check(&mut errors));
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            errors.push(not_a_function(&item));
            return with_errors(item, errors.into_inner());
        }
    };
    signature::check(&func.sig, &mut errors);
    let key_arguments = options.as_ref().map(|o| {
        Params::of(&func.sig).key_arguments(&o.key, &o.segments, &func.sig.ident, &mut errors)
    });
    match (errors.into_inner(), options, key_arguments) {
        (None, Some(options), Some(key_arguments)) => generate(&func, &options, &key_arguments),
        // Never emit the function unlocked without an error saying why.
        (errors, ..) => with_errors(
            item,
            errors.or_else(|| {
                Some(syn::Error::new(
                    Span::call_site(),
                    "#[distributed_lock] could not expand this function",
                ))
            }),
        ),
    }
}

fn with_errors(item: TokenStream, errors: Option<syn::Error>) -> TokenStream {
    let errors = errors.map(|e| e.to_compile_error()).unwrap_or_default();
    quote!(#item #errors)
}

fn not_a_function(item: &TokenStream) -> syn::Error {
    if let Ok(declaration) = syn::parse2::<syn::TraitItemFn>(item.clone())
        && declaration.default.is_none()
    {
        return syn::Error::new_spanned(
            &declaration.sig,
            "#[distributed_lock] needs a function body: put it on the `async fn` in the `impl` block, not on the trait's declaration",
        );
    }
    syn::Error::new_spanned(
        item,
        "#[distributed_lock] applies to `async fn` items (free functions and methods)",
    )
}

fn generate(func: &ItemFn, options: &Options, key_arguments: &[TokenStream]) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let outer = attrs.iter().filter(|a| matches!(a.style, AttrStyle::Outer));
    let inner = attrs
        .iter()
        .filter(|a| matches!(a.style, AttrStyle::Inner(_)));
    let site = Span::mixed_site();
    let krate = &options.krate;

    let key = key_expression(options, key_arguments);
    let request = match &options.locker {
        Some(locker) => {
            // Spanned at the expression: a wrong type is reported there.
            let borrowed = quote_spanned!(locker.span()=> &(#locker));
            quote_spanned! {site=>
            ::core::result::Result::Ok::<_, #krate::LockError>({
                let __lock_locker: &#krate::Locker = #borrowed;
                __lock_locker.lock(__lock_key)
            })
            }
        }
        None => quote_spanned! {site=>
            #krate::__private::global().map(|__lock_locker| __lock_locker.lock(__lock_key))
        },
    };
    // The key template is the lock's class in metrics and spans: one label per function's
    // template, never the key made from it.
    let template = &options.key;
    let mut settings = quote_spanned!(site=> .class(#template));
    if let Some(wait) = options.wait {
        let ms = millis(wait);
        settings
            .extend(quote_spanned!(site=> .wait(#krate::__private::Duration::from_millis(#ms))));
    }
    if options.no_wait {
        settings.extend(quote_spanned!(site=> .no_wait()));
    }
    if let Some(lease) = options.lease {
        let ms = millis(lease);
        settings
            .extend(quote_spanned!(site=> .lease(#krate::__private::Duration::from_millis(#ms))));
    }
    if options.fenced {
        settings.extend(quote_spanned!(site=> .fenced()));
    }

    let fake_return_edge = match &sig.output {
        ReturnType::Type(_, ty) => {
            let ty = erase_impl_trait(ty);
            quote_spanned! {site=>
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::let_with_type_underscore,
                    clippy::needless_return,
                    clippy::unreachable
                )]
                if false {
                    let __lock_fake_return: #ty = loop {};
                    return __lock_fake_return;
                }
            }
        }
        // Refused by `signature::check`.
        ReturnType::Default => TokenStream::new(),
    };
    // The conversion of a `LockError` into `E` is passed in as `From::from`, spanned at `E` in
    // the signature: when `E: From<LockError>` does not hold, rustc reports it there.
    let error_span = error_type_span(&sig.output);
    let convert = quote_spanned!(error_span=> ::core::convert::From::from);
    let configure = quote_spanned!(site=> .map(|__lock_request| __lock_request #settings));

    // The body's statements, not its block: `async move { {..} }` around a one-line body is
    // reported by `unused_braces`, at the user's code.
    let stmts = &block.stmts;
    let locked = quote_spanned! {site=>
        async move {
            #fake_return_edge
            #(#stmts)*
        }
    };
    let run = match options.idempotent {
        None => quote_spanned! {site=>
            #krate::__private::run_locked(#request #configure, #locked, #convert)
        },
        Some(ttl) => {
            // Spanned at `T`: the `Serialize + DeserializeOwned` bound of `stored` is
            // reported there.
            // The crate path too: a call spanned partly at the attribute is reported there.
            let t_span = ok_type_span(&sig.output);
            let krate_at_t: TokenStream = krate
                .to_token_stream()
                .into_iter()
                .map(|mut token| {
                    token.set_span(t_span);
                    token
                })
                .collect();
            // Named by the function: a record is replayed only to the function that stored
            // it. A closure's type name is the path of the function instance it is in, `Self`
            // included (`<shop::Refunds as shop::Close>::all`), which `module_path!()` and the
            // function's name are not.
            let stored_at_t = quote_spanned!(t_span=> #krate_at_t::__private::stored());
            let stored = quote_spanned! {site=>
                #stored_at_t.called_by({
                    let __lock_here = || ();
                    #krate::__private::function_path(&__lock_here)
                })
            };
            let ttl = match ttl {
                Some(ttl) => {
                    let ms = millis(ttl);
                    quote_spanned!(site=> #krate::__private::Duration::from_millis(#ms))
                }
                None => quote_spanned!(site=> #krate::DEFAULT_RESULT_TTL),
            };
            quote_spanned! {site=>
                #krate::__private::run_idempotent(#request #configure, #stored, #ttl, #locked, #convert)
            }
        }
    };
    let body = quote_spanned! {site=>
        {
            #(#inner)*
            let __lock_key = #key;
            #run.await
        }
    };
    quote! {
        #(#outer)*
        #vis #sig
        #body
    }
}

/// The key: a string literal when the template has no placeholder, else a `format!`.
fn key_expression(options: &Options, arguments: &[TokenStream]) -> TokenStream {
    let span = options.key.span();
    let constant = arguments.is_empty();
    let mut format = String::new();
    for segment in &options.segments {
        match segment {
            Segment::Text(text) if constant => format.push_str(text),
            Segment::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Segment::Value(_) => format.push_str("{}"),
        }
    }
    let mut literal = Literal::string(&format);
    literal.set_span(span);
    if constant {
        return literal.into_token_stream();
    }
    quote_spanned!(span=> ::std::format!(#literal, #(#arguments),*))
}

fn millis(d: std::time::Duration) -> Literal {
    // In range: durations were checked against lock-core's bounds (at most 7 days).
    Literal::u64_unsuffixed(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The span of `E` in `Result<T, E>`, else of the whole return type.
fn error_type_span(output: &ReturnType) -> Span {
    result_argument_span(output, 1)
}

/// The span of `T` in `Result<T, E>`, else of the whole return type.
fn ok_type_span(output: &ReturnType) -> Span {
    result_argument_span(output, 0)
}

/// The span of the `n`th type argument of the return type, else of the whole return type.
fn result_argument_span(output: &ReturnType, n: usize) -> Span {
    let ReturnType::Type(_, ty) = output else {
        return Span::call_site();
    };
    if let Type::Path(path) = &**ty
        && let Some(last) = path.path.segments.last()
        && let PathArguments::AngleBracketed(args) = &last.arguments
        && let Some(GenericArgument::Type(argument)) = args
            .args
            .iter()
            .filter(|a| matches!(a, GenericArgument::Type(_)))
            .nth(n)
    {
        return argument.span();
    }
    ty.span()
}

/// Replaces every `impl Trait` with `_`, so the return type can annotate a `let`.
fn erase_impl_trait(ty: &Type) -> Type {
    struct Eraser;
    impl VisitMut for Eraser {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(it) = ty {
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](it.span()),
                });
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    let mut ty = ty.clone();
    Eraser.visit_type_mut(&mut ty);
    ty
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(attr: TokenStream, item: TokenStream) -> String {
        distributed_lock(attr, item).to_string()
    }

    #[test]
    fn errors_keep_the_original_item() {
        let out = expand(
            quote!(key = "k", nope),
            quote!(
                async fn f() -> Result<(), E> {
                    body()
                }
            ),
        );
        assert!(
            out.contains("async fn f () -> Result < () , E > { body () }"),
            "{out}"
        );
        assert!(out.contains("compile_error"), "{out}");
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let out = expand(
            quote!(key = "{nope}", wait = "1x"),
            quote!(
                fn f() {}
            ),
        );
        for expected in [
            "unknown unit",
            "needs an `async fn`",
            "needs a function returning",
            "unknown name `nope`",
        ] {
            assert!(out.contains(expected), "{expected}: {out}");
        }
    }

    #[test]
    fn literal_keys_are_unescaped_and_not_formatted() {
        let out = expand(
            quote!(key = "a{{b}}"),
            quote!(
                async fn f() -> Result<(), E> {}
            ),
        );
        assert!(out.contains("let __lock_key = \"a{b}\""), "{out}");
        assert!(!out.contains("format"), "{out}");
    }

    #[test]
    fn formatted_keys_escape_braces() {
        let out = expand(
            quote!(key = "a{{{id}}}"),
            quote!(
                async fn f(id: u32) -> Result<(), E> {}
            ),
        );
        assert!(out.contains("format ! (\"a{{{}}}\" , id)"), "{out}");
    }
}
