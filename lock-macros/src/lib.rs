#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

mod args;
mod duration;
mod expand;
mod signature;
mod template;

#[cfg(test)]
mod snapshots;

/// Runs an `async fn`'s body under a distributed lock whose key is built from the function's
/// arguments.
///
/// Use it through lock-core (`lock_core::distributed_lock`, default feature `macros`).
///
/// ```
/// # #[derive(Debug)] struct Reservation { left: u32 }
/// # #[derive(Debug)] enum ShopError { Lock(lock_core::LockError), OutOfStock }
/// # impl From<lock_core::LockError> for ShopError {
/// #     fn from(e: lock_core::LockError) -> Self { ShopError::Lock(e) }
/// # }
/// # static STOCK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(3);
/// use lock_core::distributed_lock;
///
/// // At most one call per SKU at a time, in every process sharing the locker's backend.
/// #[distributed_lock(key = "inventory:{sku}", wait = "2s")]
/// async fn reserve(sku: &str, qty: u32) -> Result<Reservation, ShopError> {
///     use std::sync::atomic::Ordering::SeqCst;
///     let left = STOCK.load(SeqCst).checked_sub(qty).ok_or(ShopError::OutOfStock)?;
///     STOCK.store(left, SeqCst); // read-modify-write made safe by the lock
///     Ok(Reservation { left })
/// }
///
/// # async fn demo() -> Result<(), ShopError> {
/// lock_core::set_global(lock_core::Locker::memory()); // once, at start-up
/// assert_eq!(reserve("sku-42", 1).await?.left, 2);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// # What it does
///
/// Each call builds the key, asks the locker for the lock with the options given, runs the
/// original body while the lock is held, and releases it afterwards — exactly
/// `locker.lock(key).wait(..).lease(..).fenced().run(async move { body }).await`.
///
/// - The body never runs without the lock. Acquisition errors (`Busy`, `Timeout`,
///   `InvalidKey`, `Backend`, `NoGlobalLocker`...) are returned through the function's error
///   type with `From<LockError>`, without running the body.
/// - While the body runs the watchdog renews the lease. If the lease is lost anyway (the
///   backend unreachable for longer than the lease, the key deleted), the body is dropped at its
///   next `.await` and the function returns `LockError::LeaseLost` through `From`.
/// - Reentrant within one task: a locked function that calls another locked function (or
///   `locker.lock(..).run(..)`) with the same key and locker does not wait for itself; the
///   outermost call releases. Spawned tasks are not part of the caller's scope.
/// - Inside the body, [`lock_core::current_lock()`] describes the lock (key, fence, remaining
///   lease, a `lost()` signal) and [`lock_core::current_fence()`] returns the fencing token.
///
/// [`lock_core::current_lock()`]: https://docs.rs/lock-core/latest/lock_core/fn.current_lock.html
/// [`lock_core::current_fence()`]: https://docs.rs/lock-core/latest/lock_core/fn.current_fence.html
///
/// # The function
///
/// An `async fn` (free function, `&self` / `&mut self` / `self` method, a trait impl's native
/// `async fn`) with generics, `impl Trait` and pattern parameters, returning `Result<T, E>`
/// where `E: From<lock_core::LockError>`. Aliases such as `io::Result<T>` or `anyhow::Result<T>`
/// work when they are named `Result`. Attributes, doc comments, visibility and `where` clauses
/// are kept; `#[tracing::instrument]` may be placed above (the span covers only the body) or
/// below (the span covers waiting for the lock too). The key template, as written, is the
/// lock's class in lock-core's metrics and spans (`LockRequest::class`): `"inventory:{sku}"`
/// is one label, whatever the SKUs.
///
/// A `fn` that is not `async`, a `const fn`, or a return type that is not a `Result` is a
/// compile error that says what to write instead.
///
/// # Options
///
/// | option | value | default |
/// |---|---|---|
/// | `key` | template, required | — |
/// | `locker` | expression evaluating to a `Locker` (or `&Locker`, `Arc<Locker>`...) | `lock_core::global()` |
/// | `wait` | duration string, at most 24h | the locker's (10s unless configured) |
/// | `no_wait` | flag: one attempt, `LockError::Busy` when held | — |
/// | `lease` | duration string, 10ms to 7d | the locker's (30s unless configured) |
/// | `fenced` | flag: draw a fencing token | off |
/// | `idempotent` | flag, or a TTL string from 1ms to 365d: at most one run per key, the first `Ok` value stored and returned to later calls | off (24h TTL when on) |
/// | `crate` | path of lock-core as your crate names it | `::lock_core` |
///
/// Every option is checked at compile time: unknown or duplicate options, bad durations,
/// durations out of lock-core's range, `wait` with `no_wait`, and key templates naming
/// something that is not a parameter are errors at the attribute.
///
/// ## `key = "..."`
///
/// The lock's name. `{name}` inserts a parameter, `{name.field.field}` (or `{name.0}`) one of
/// its fields, `{self.field}` a field of the receiver — each formatted with `Display`. `{{` and
/// `}}` are literal braces. The key is built before the body starts, borrowing the arguments.
/// Parameters bound by a pattern (`(a, b): (u32, u32)`) cannot be named: bind them to a name.
///
/// ```
/// # #[derive(Debug)] struct AppError(lock_core::LockError);
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
/// use lock_core::{current_lock, distributed_lock, Locker};
///
/// struct Draw { id: u64 }
/// struct Lottery { locker: Locker, region: &'static str }
///
/// impl Lottery {
///     #[distributed_lock(key = "{self.region}:user:{user_id}:draw:{draw.id}:{{v2}}", locker = self.locker)]
///     async fn draw(&self, user_id: u64, draw: &Draw) -> Result<String, AppError> {
///         Ok(current_lock().map(|l| l.key().to_owned()).unwrap_or_default())
///     }
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// let lottery = Lottery { locker: Locker::memory(), region: "eu" };
/// let key = lottery.draw(7, &Draw { id: 3 }).await?;
/// assert_eq!(key, "eu:user:7:draw:3:{v2}");
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// ## `locker = <expr>`
///
/// Which [`Locker`] to use, evaluated at each call before the body starts; it may use the
/// parameters and `self`. Without it the process-wide locker set with `lock_core::set_global`
/// is used; when none is set the call returns `LockError::NoGlobalLocker` through your error
/// type (no panic) and the body does not run.
///
/// [`Locker`]: https://docs.rs/lock-core/latest/lock_core/struct.Locker.html
///
/// ```
/// # #[derive(Debug)] struct AppError(lock_core::LockError);
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
/// use lock_core::{distributed_lock, LockError, Locker};
///
/// #[distributed_lock(key = "report:{day}", locker = locker)]
/// async fn build_report(locker: &Locker, day: u32) -> Result<u32, AppError> {
///     Ok(day)
/// }
///
/// #[distributed_lock(key = "report:{day}")] // the global locker
/// async fn build_report_globally(day: u32) -> Result<u32, AppError> {
///     Ok(day)
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// assert_eq!(build_report(&Locker::memory(), 1).await?, 1);
/// lock_core::clear_global();
/// let err = build_report_globally(2).await.unwrap_err();
/// assert!(matches!(err, AppError(LockError::NoGlobalLocker)));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// ## `wait = "..."` and `no_wait`
///
/// How long a call waits for a busy lock before failing with `LockError::Timeout` (at most
/// `"24h"`; `"0s"` is one attempt). `no_wait` makes one attempt and fails with
/// `LockError::Busy`: "skip if someone else is already doing it". They cannot be combined.
/// Durations are written as number-unit parts: `"500ms"`, `"2s"`, `"1m30s"`, `"1h"`, `"7d"`
/// (units `ms`, `s`, `m`, `h`, `d`).
///
/// ```
/// # #[derive(Debug)] struct AppError(lock_core::LockError);
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
/// use lock_core::{distributed_lock, LockError, Locker};
///
/// #[distributed_lock(key = "nightly-job", locker = locker, no_wait)]
/// async fn nightly_job(locker: &Locker) -> Result<(), AppError> {
///     Ok(())
/// }
///
/// #[distributed_lock(key = "nightly-job", locker = locker, wait = "50ms")]
/// async fn nightly_job_patiently(locker: &Locker) -> Result<(), AppError> {
///     Ok(())
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// let locker = Locker::memory();
/// let held = locker.lock("nightly-job").await?; // someone else is running it
/// assert!(matches!(nightly_job(&locker).await, Err(AppError(LockError::Busy { .. }))));
/// assert!(matches!(nightly_job_patiently(&locker).await, Err(AppError(LockError::Timeout { .. }))));
/// held.release().await?;
/// nightly_job(&locker).await?;
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// ## `idempotent` and `idempotent = "..."`
///
/// The body runs at most once per key within the TTL (`idempotent` alone:
/// `lock_core::DEFAULT_RESULT_TTL`, 24 h), in every process sharing the backend: its first `Ok`
/// value is stored as JSON (`T: Serialize + DeserializeOwned`, a compile error at `T`
/// otherwise) and returned to every later call with the same key, concurrent (they wait for the
/// lock as configured, then read the stored value) or not (one read, no lock). An `Err` is not
/// stored. A store refused because the lease was lost is `LockError::LeaseLost`, never a
/// success; a stored record of another function (two functions sharing a key template) or of
/// another type is `LockError::IdempotencyKeyReused` (the body does not run), one that no
/// longer deserializes into `T` is `LockError::InvalidConfig`. A call that finds the key
/// started without a value (a refused store, a crash, a cancelled call) gets
/// `LockError::OutcomeUnknown`, never a second run. With `no_wait`, a duplicate while the
/// first call runs gets `LockError::Busy`. See ["Idempotent functions" in lock-macros'
/// README](https://docs.rs/lock-macros/latest/lock_macros/#idempotent-functions).
///
/// ```
/// # #[derive(Debug)] struct AppError(lock_core::LockError);
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
/// use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
/// use lock_core::{distributed_lock, Locker};
///
/// static RUNS: AtomicU32 = AtomicU32::new(0);
///
/// #[distributed_lock(key = "payout:{week}", locker = locker, idempotent = "7d")]
/// async fn payout(locker: &Locker, week: u32) -> Result<(u32, u32), AppError> {
///     Ok((week, RUNS.fetch_add(1, SeqCst) + 1))
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// let locker = Locker::memory();
/// assert_eq!(payout(&locker, 9).await?, (9, 1));
/// assert_eq!(payout(&locker, 9).await?, (9, 1)); // replayed: the body did not run
/// assert_eq!(RUNS.load(SeqCst), 1);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// ## `lease = "..."`
///
/// How long the lock outlives a holder that stops renewing it (a crashed process), from `"10ms"`
/// to `"7d"`. While the body runs, the watchdog renews the lease every lease/3, so a long body
/// keeps its lock; a lost lease cancels the body with `LockError::LeaseLost`.
///
/// ```
/// # #[derive(Debug)] struct AppError(lock_core::LockError);
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
/// use lock_core::{current_lock, distributed_lock, Locker};
///
/// #[distributed_lock(key = "payment:{id}", locker = locker, lease = "5s")]
/// async fn charge(locker: &Locker, id: u64) -> Result<bool, AppError> {
///     Ok(current_lock().is_some_and(|l| l.is_held()))
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// assert!(charge(&Locker::memory(), 9).await?);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// ## `fenced`
///
/// Draws a fencing token with the lock: a number strictly greater than every token drawn
/// before for this key. Read it in the body with `lock_core::current_fence()` and pass it to
/// the storage you write to, so a write from a holder whose lease expired can be refused.
///
/// ```
/// # #[derive(Debug)] struct AppError(lock_core::LockError);
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
/// use lock_core::{current_fence, distributed_lock, Locker};
///
/// #[distributed_lock(key = "ledger:{account}", locker = locker, fenced)]
/// async fn post(locker: &Locker, account: &str) -> Result<u64, AppError> {
///     Ok(current_fence().unwrap_or_default()) // e.g. UPDATE .. WHERE fence < $token
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// let locker = Locker::memory();
/// let first = post(&locker, "acc-1").await?;
/// let second = post(&locker, "acc-1").await?;
/// assert!(second > first);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// ## `crate = "..."`
///
/// The generated code names `::lock_core`. If your `Cargo.toml` renames the dependency
/// (`locks = { package = "lock-core", .. }`), or you re-export lock-core from another crate,
/// say where it is:
///
/// ```
/// # #[derive(Debug)] struct AppError(lock_core::LockError);
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError(e) } }
/// mod platform {
///     pub use lock_core as locks; // a re-export, as a company-wide crate might do
/// }
///
/// #[platform::locks::distributed_lock(key = "k", locker = locker, crate = "platform::locks")]
/// async fn job(locker: &platform::locks::Locker) -> Result<(), AppError> {
///     Ok(())
/// }
/// # async fn demo() -> Result<(), AppError> {
/// # job(&lock_core::Locker::memory()).await
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// # Errors, `?` and reentrancy
///
/// `?` inside the body converts into the declared error type as usual. A locked function may
/// call another one with the same key: the inner call runs at once under the outer lock.
///
/// ```
/// # #[derive(Debug)] enum AppError { Lock(lock_core::LockError), Parse(std::num::ParseIntError) }
/// # impl From<lock_core::LockError> for AppError { fn from(e: lock_core::LockError) -> Self { AppError::Lock(e) } }
/// # impl From<std::num::ParseIntError> for AppError { fn from(e: std::num::ParseIntError) -> Self { AppError::Parse(e) } }
/// use lock_core::{distributed_lock, Locker};
///
/// #[distributed_lock(key = "account:{id}", locker = locker)]
/// async fn transfer(locker: &Locker, id: u32, amount: &str) -> Result<u32, AppError> {
///     let amount: u32 = amount.parse()?; // `?` works as in any function
///     audit(locker, id).await?;          // same key, same task: no self-deadlock
///     Ok(amount)
/// }
///
/// #[distributed_lock(key = "account:{id}", locker = locker, no_wait)]
/// async fn audit(locker: &Locker, id: u32) -> Result<(), AppError> {
///     Ok(())
/// }
///
/// # async fn demo() -> Result<(), AppError> {
/// let locker = Locker::memory();
/// assert_eq!(transfer(&locker, 1, "25").await?, 25);
/// assert!(matches!(transfer(&locker, 1, "x").await, Err(AppError::Parse(_))));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[proc_macro_attribute]
pub fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(attr.into(), item.into()).into()
}
