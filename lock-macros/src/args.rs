//! The attribute's options: `key = "..."`, `locker = <expr>`, `wait = "..."` | `no_wait`,
//! `lease = "..."`, `fenced`, `idempotent` | `idempotent = "..."`, `crate = "..."`.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitStr, Path, Token};

use crate::duration;
use crate::template::{self, Segment};

const OPTIONS: &str =
    "`key`, `locker`, `wait`, `no_wait`, `lease`, `fenced`, `idempotent`, `crate`";

/// The options as written, each with the token it came from (for spans).
#[derive(Default)]
pub(crate) struct Args {
    key: Option<LitStr>,
    locker: Option<Expr>,
    wait: Option<LitStr>,
    no_wait: Option<Ident>,
    lease: Option<LitStr>,
    fenced: Option<Ident>,
    /// `idempotent`, with its TTL when one is given.
    idempotent: Option<(Ident, Option<LitStr>)>,
    krate: Option<LitStr>,
    /// Option names in the order written.
    order: Vec<String>,
}

/// The options, checked: what `expand` generates code from.
pub(crate) struct Options {
    pub(crate) key: LitStr,
    pub(crate) segments: Vec<Segment>,
    pub(crate) locker: Option<Expr>,
    pub(crate) wait: Option<Duration>,
    pub(crate) no_wait: bool,
    pub(crate) lease: Option<Duration>,
    pub(crate) fenced: bool,
    /// `Some(None)`: idempotent with lock-core's default TTL; `Some(Some(ttl))`: with `ttl`.
    pub(crate) idempotent: Option<Option<Duration>>,
    pub(crate) krate: Path,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            // `parse_any` so that `crate` (a keyword) is accepted as an option name.
            let name = Ident::parse_any(input)?;
            args.order.push(name.to_string());
            match name.to_string().as_str() {
                "key" => set(
                    &mut args.key,
                    &name,
                    string_value(input, &name, KEY_EXAMPLE)?,
                )?,
                "wait" => set(&mut args.wait, &name, string_value(input, &name, "\"2s\"")?)?,
                "lease" => set(
                    &mut args.lease,
                    &name,
                    string_value(input, &name, "\"30s\"")?,
                )?,
                "crate" => set(
                    &mut args.krate,
                    &name,
                    string_value(input, &name, "\"::lock_core\"")?,
                )?,
                "locker" => {
                    equals(input, &name, "self.locker")?;
                    let expr: Expr = input.parse()?;
                    set(&mut args.locker, &name, expr)?;
                }
                "no_wait" => set(&mut args.no_wait, &name, flag(input, &name)?)?,
                "fenced" => set(&mut args.fenced, &name, flag(input, &name)?)?,
                "idempotent" => {
                    let ttl = if input.peek(Token![=]) {
                        Some(string_value(input, &name, "\"7d\"")?)
                    } else {
                        None
                    };
                    set(&mut args.idempotent, &name, (name.clone(), ttl))?;
                }
                other => {
                    let hint = suggestion(other)
                        .map(|s| format!("; did you mean `{s}`?"))
                        .unwrap_or_default();
                    return Err(syn::Error::new(
                        name.span(),
                        format!(
                            "unknown option `{other}` for #[distributed_lock]{hint} (options: {OPTIONS})"
                        ),
                    ));
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

const KEY_EXAMPLE: &str = "\"order:{id}\"";

fn set<T>(slot: &mut Option<T>, name: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            name.span(),
            format!("duplicate option `{name}`: give it once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn equals(input: ParseStream<'_>, name: &Ident, example: &str) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        return Ok(());
    }
    Err(syn::Error::new(
        name.span(),
        format!("`{name}` needs a value: write `{name} = {example}`"),
    ))
}

fn string_value(input: ParseStream<'_>, name: &Ident, example: &str) -> syn::Result<LitStr> {
    equals(input, name, example)?;
    if input.peek(LitStr) {
        return input.parse();
    }
    // Take the whole value so the error covers what was written.
    let value: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        value,
        format!("`{name}` takes a string literal: write `{name} = {example}`"),
    ))
}

fn flag(input: ParseStream<'_>, name: &Ident) -> syn::Result<Ident> {
    if input.peek(Token![=]) {
        return Err(syn::Error::new(
            name.span(),
            format!("`{name}` is a flag and takes no value: write `{name}` alone"),
        ));
    }
    Ok(name.clone())
}

/// The option a misspelled or foreign name probably meant.
fn suggestion(unknown: &str) -> Option<&'static str> {
    let lower = unknown.to_ascii_lowercase();
    let synonym = match lower.as_str() {
        "name" | "keys" | "id" => Some("key"),
        "timeout" | "wait_time" | "wait_for" | "max_wait" => Some("wait"),
        "nowait" | "try_lock" | "trylock" | "try" | "skip_if_locked" => Some("no_wait"),
        "ttl" | "expire" | "expiry" | "lease_time" | "lock_at_most_for" => Some("lease"),
        "fence" | "fencing" | "fencing_token" => Some("fenced"),
        "client" | "lock" | "lock_manager" => Some("locker"),
        "krate" | "path" => Some("crate"),
        "idempotency" | "once" | "dedup" | "deduplicate" | "idempotent_ttl" => Some("idempotent"),
        _ => None,
    };
    synonym.or_else(|| {
        [
            "key",
            "locker",
            "wait",
            "no_wait",
            "lease",
            "fenced",
            "idempotent",
            "crate",
        ]
        .into_iter()
        .find(|option| edit_distance(&lower, option) <= 2)
    })
}

/// Levenshtein distance, for "did you mean" hints.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

impl Args {
    /// Checks the options together, reporting every problem found to `errors`. Returns the
    /// options when the key is usable (so that its names can still be checked against the
    /// parameters when another option is wrong).
    pub(crate) fn check(self, errors: &mut Errors) -> Option<Options> {
        let Args {
            key,
            locker,
            wait,
            no_wait,
            lease,
            fenced,
            idempotent,
            krate,
            order,
        } = self;
        let segments = match &key {
            Some(lit) => errors
                .take(template::parse(&lit.value()).map_err(|m| syn::Error::new(lit.span(), m))),
            None => {
                errors.push(syn::Error::new(
                    Span::call_site(),
                    format!("missing `key`: say what the lock protects, e.g. #[distributed_lock(key = {KEY_EXAMPLE})]"),
                ));
                None
            }
        };
        let wait_value = wait.as_ref().and_then(|lit| {
            errors.take(
                duration::parse(&lit.value())
                    .and_then(|d| duration::check_wait(d).map(|()| d))
                    .map_err(|m| syn::Error::new(lit.span(), m)),
            )
        });
        if let (Some(wait), Some(no_wait)) = (&wait, &no_wait) {
            // Point at whichever came second: that is the one to remove or reconsider.
            let wait_first =
                order.iter().position(|o| o == "wait") < order.iter().position(|o| o == "no_wait");
            let second = if wait_first {
                no_wait.span()
            } else {
                wait.span()
            };
            errors.push(syn::Error::new(
                second,
                "`wait` and `no_wait` cannot be combined: `no_wait` makes one attempt and fails with `LockError::Busy`, `wait = \"..\"` waits up to that long; keep one",
            ));
        }
        let lease_value = lease.as_ref().and_then(|lit| {
            errors.take(
                duration::parse(&lit.value())
                    .and_then(|d| duration::check_lease(d).map(|()| d))
                    .map_err(|m| syn::Error::new(lit.span(), m)),
            )
        });
        // `no_wait` is allowed: a duplicate while the first call runs gets `LockError::Busy`
        // at once (HTTP's 409 in flight), one after it gets the stored value.
        let idempotent_value = idempotent.as_ref().map(|(_, ttl)| {
            ttl.as_ref().and_then(|lit| {
                errors.take(
                    duration::parse(&lit.value())
                        .and_then(|d| duration::check_result_ttl(d).map(|()| d))
                        .map_err(|m| syn::Error::new(lit.span(), m)),
                )
            })
        });
        let krate = match &krate {
            Some(lit) => errors.take(lit.parse::<Path>().map_err(|_| {
                syn::Error::new(
                    lit.span(),
                    "`crate` takes the path of lock-core as your crate names it, e.g. crate = \"::lock_core\" or crate = \"my_locks\"",
                )
            })),
            None => Some(syn::parse_quote!(::lock_core)),
        };
        Some(Options {
            key: key?,
            segments: segments?,
            locker,
            wait: wait_value,
            no_wait: no_wait.is_some(),
            lease: lease_value,
            fenced: fenced.is_some(),
            idempotent: idempotent_value,
            krate: krate.unwrap_or_else(|| syn::parse_quote!(::lock_core)),
        })
    }
}

/// Collects errors so that one compile reports them all.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn take<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    pub(crate) fn into_inner(self) -> Option<syn::Error> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(tokens: proc_macro2::TokenStream) -> Result<Options, String> {
        let mut errors = Errors::default();
        let options = syn::parse2::<Args>(tokens).map(|args| args.check(&mut errors));
        match (options, errors.into_inner()) {
            (Ok(Some(options)), None) => Ok(options),
            (Err(e), _) | (_, Some(e)) => Err(e.to_string()),
            (Ok(None), None) => Err("no options and no error".into()),
        }
    }

    #[test]
    fn accepts_every_option() {
        let o = check(quote::quote!(
            key = "user:{req.user_id}",
            locker = self.locker,
            wait = "1m30s",
            lease = "10s",
            fenced,
            idempotent = "7d",
            crate = "my_locks"
        ))
        .unwrap();
        assert_eq!(o.key.value(), "user:{req.user_id}");
        assert!(o.locker.is_some());
        assert_eq!(o.wait, Some(Duration::from_secs(90)));
        assert_eq!(o.lease, Some(Duration::from_secs(10)));
        assert!(o.fenced && !o.no_wait);
        assert!(o.krate.is_ident("my_locks"));
        assert_eq!(o.idempotent, Some(Some(Duration::from_secs(7 * 86_400))));
        let o = check(quote::quote!(key = "k", idempotent, no_wait)).unwrap();
        assert_eq!(o.idempotent, Some(None));
        let o = check(quote::quote!(key = "k", no_wait,)).unwrap();
        assert!(o.no_wait && o.wait.is_none());
    }

    #[test]
    fn refuses_misuse_with_a_hint() {
        for (tokens, hint) in [
            (
                quote::quote!(key = "k", timeout = "2s"),
                "did you mean `wait`?",
            ),
            (quote::quote!(key = "k", fence), "did you mean `fenced`?"),
            (
                quote::quote!(key = "k", laese = "2s"),
                "did you mean `lease`?",
            ),
            (
                quote::quote!(key = "k", key = "j"),
                "duplicate option `key`",
            ),
            (quote::quote!(key = "k", fenced = true), "is a flag"),
            (quote::quote!(key = "k", wait = 2), "takes a string literal"),
            (quote::quote!(key), "`key` needs a value"),
            (quote::quote!(wait = "2s"), "missing `key`"),
            (
                quote::quote!(key = "k", wait = "2s", no_wait),
                "cannot be combined",
            ),
            (quote::quote!(key = "k", lease = "5ms"), "out of range"),
            (quote::quote!(key = "k", wait = "2d"), "out of range"),
            (quote::quote!(key = "k", idempotent = "0s"), "out of range"),
            (
                quote::quote!(key = "k", idempotent = "366d"),
                "out of range",
            ),
            (
                quote::quote!(key = "k", idempotent = 7),
                "takes a string literal",
            ),
            (quote::quote!(key = "k", once), "did you mean `idempotent`?"),
            (
                quote::quote!(key = "k", crate = "not a path"),
                "`crate` takes the path",
            ),
        ] {
            let err = check(tokens.clone()).err().unwrap_or_default();
            assert!(err.contains(hint), "{tokens}: {err}");
        }
    }
}
