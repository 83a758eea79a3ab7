//! `#[tracing::instrument]` stacked above and below `#[distributed_lock]`, and which of the two
//! covers the other.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lock_core::{LockError, Locker, current_lock, distributed_lock};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lock: {}", self.0)
    }
}

// Expanded first, tracing wraps the original body; the lock is then taken around it, outside
// the span: the span covers the body only.
#[tracing::instrument(skip(locker), err)]
#[distributed_lock(key = "order:{id}", locker = locker)]
async fn instrumented_outside(locker: &Locker, id: u64) -> Result<u64, AppError> {
    tracing::info!("inside");
    Ok(id)
}

// Expanded first, the lock wraps the original body; tracing then wraps all of it: the span
// covers waiting for the lock too.
#[distributed_lock(key = "order:{id}", locker = locker)]
#[tracing::instrument(skip(locker))]
async fn instrumented_inside(locker: &Locker, id: u64) -> Result<u64, AppError> {
    tracing::info!("inside");
    Ok(id)
}

/// Records, at the first entry into each span of the functions (not lock-core's own
/// `lock.acquire` and `lock.held`), whether the lock was already held.
#[derive(Default)]
struct LockAtEnter {
    next: AtomicU64,
    functions: Mutex<Vec<u64>>,
    first_enter_held: Mutex<Vec<bool>>,
    entered: Mutex<Vec<u64>>,
}

impl Subscriber for LockAtEnter {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        if attributes.metadata().name().starts_with("instrumented_") {
            self.functions.lock().unwrap().push(id);
        }
        Id::from_u64(id)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, span: &Id) {
        if !self.functions.lock().unwrap().contains(&span.into_u64()) {
            return;
        }
        let mut entered = self.entered.lock().unwrap();
        if !entered.contains(&span.into_u64()) {
            entered.push(span.into_u64());
            self.first_enter_held.lock().unwrap().push(current_lock().is_some());
        }
    }
    fn exit(&self, _: &Id) {}
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let locker = Locker::memory();
    let subscriber = std::sync::Arc::new(LockAtEnter::default());
    tracing::subscriber::with_default(subscriber.clone(), || {
        assert_eq!(rt.block_on(instrumented_outside(&locker, 1)).unwrap(), 1);
        assert_eq!(rt.block_on(instrumented_inside(&locker, 2)).unwrap(), 2);
    });
    // Above: the lock is held when the span is first entered. Below: it is not yet.
    assert_eq!(*subscriber.first_enter_held.lock().unwrap(), vec![true, false]);
}
