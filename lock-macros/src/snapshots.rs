//! Expansion snapshots: `tests/expand/<name>.rs` holds annotated functions, and
//! `tests/expand/<name>.expanded.rs` what the macro turns them into, pretty-printed, so that
//! reviewers read the generated code. A changed expansion fails this test; to accept it, run
//! `LOCK_MACROS_BLESS=1 cargo test -p lock-macros --lib snapshots` and review the diff.

use std::path::{Path, PathBuf};

use syn::visit_mut::VisitMut;
use syn::{Attribute, ImplItem, Item, Meta};

use crate::expand;

#[test]
fn expansions_match_the_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/expand");
    let bless = std::env::var_os("LOCK_MACROS_BLESS").is_some();
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            let name = p.to_string_lossy();
            name.ends_with(".rs") && !name.ends_with(".expanded.rs")
        })
        .collect();
    inputs.sort();
    assert!(
        !inputs.is_empty(),
        "no snapshot inputs in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    for input in inputs {
        let mut file = syn::parse_file(&std::fs::read_to_string(&input).unwrap()).unwrap();
        let mut expander = Expander { expanded: 0 };
        expander.visit_file_mut(&mut file);
        assert!(
            expander.expanded > 0,
            "{}: nothing to expand",
            input.display()
        );
        let actual = prettyplease::unparse(&file);
        let golden = input.with_extension("expanded.rs");
        if bless {
            std::fs::write(&golden, &actual).unwrap();
            continue;
        }
        match std::fs::read_to_string(&golden) {
            Ok(expected) if expected == actual => {}
            Ok(_) => failures.push(format!("{} changed; got:\n{actual}", golden.display())),
            Err(e) => failures.push(format!("{}: {e}", golden.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(accept with LOCK_MACROS_BLESS=1 after review)",
        failures.join("\n\n")
    );
}

/// Expands every function carrying `#[distributed_lock(..)]`, as the compiler would.
struct Expander {
    expanded: usize,
}

impl Expander {
    fn take_attribute(attrs: &mut Vec<Attribute>) -> Option<proc_macro2::TokenStream> {
        let at = attrs.iter().position(|a| {
            a.path()
                .segments
                .last()
                .is_some_and(|s| s.ident == "distributed_lock")
        })?;
        Some(match attrs.remove(at).meta {
            Meta::List(list) => list.tokens,
            _ => proc_macro2::TokenStream::new(),
        })
    }
}

impl VisitMut for Expander {
    fn visit_item_mut(&mut self, item: &mut Item) {
        if let Item::Fn(func) = item
            && let Some(args) = Self::take_attribute(&mut func.attrs)
        {
            let output = expand::distributed_lock(args, quote::quote!(#func));
            *item = syn::parse2(output).unwrap();
            self.expanded += 1;
            return;
        }
        syn::visit_mut::visit_item_mut(self, item);
    }

    fn visit_impl_item_mut(&mut self, item: &mut ImplItem) {
        if let ImplItem::Fn(func) = item
            && let Some(args) = Self::take_attribute(&mut func.attrs)
        {
            let output = expand::distributed_lock(args, quote::quote!(#func));
            *item = syn::parse2(output).unwrap();
            self.expanded += 1;
            return;
        }
        syn::visit_mut::visit_impl_item_mut(self, item);
    }
}
