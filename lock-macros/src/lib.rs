//! `#[distributed_lock]`: see the lock-core documentation. (Filled in by the macro issue.)
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

/// Runs an async fn's body under a distributed lock. Placeholder until the macro lands.
///
/// ```ignore
/// #[lock_core::distributed_lock(key = "inventory:{sku}")]
/// async fn reserve(sku: &str) -> Result<(), lock_core::LockError> { Ok(()) }
/// ```
#[proc_macro_attribute]
pub fn distributed_lock(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
