//! Shared helpers: a probe that sees overlapping critical sections, request builders, bodies.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use lock_core::{LockInfo, Locker};
use tokio::sync::{Notify, mpsc};

/// The header the tests take keys from.
pub(crate) const KEY: &str = "x-key";

/// What the test services are: a cloneable, shareable service from `Request<String>` to
/// `Response<String>` that never fails, with a `Send` future (what the layer and axum need).
pub(crate) trait TestService:
    tower::Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> TestService for S where
    S: tower::Service<
            Request<String>,
            Response = Response<String>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// A request with `x-key: key` (none when `key` is `None`).
pub(crate) fn request(key: Option<&str>) -> Request<String> {
    let mut builder = Request::post("/work");
    if let Some(key) = key {
        builder = builder.header(KEY, key);
    }
    builder.body(String::new()).unwrap()
}

/// Counts how many handlers are inside at once.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    calls: AtomicUsize,
}

impl Probe {
    pub(crate) fn enter(self: &Arc<Self>) -> Inside {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        Inside(self.clone())
    }

    pub(crate) fn max_inside(&self) -> usize {
        self.max_inside.load(Ordering::SeqCst)
    }

    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Leaves the probe on drop (also when the handler's future is dropped half-way).
pub(crate) struct Inside(Arc<Probe>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A handler that signals `entered` once inside, then never finishes; `dropped` turns true
/// when its future is dropped.
#[derive(Clone, Default)]
pub(crate) struct Stuck {
    pub(crate) entered: Arc<Notify>,
    pub(crate) dropped: Arc<AtomicBool>,
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Stuck {
    pub(crate) fn service(&self) -> impl TestService {
        let stuck = self.clone();
        tower::service_fn(move |_req: Request<String>| {
            let stuck = stuck.clone();
            async move {
                let _flag = SetOnDrop(stuck.dropped.clone());
                stuck.entered.notify_one();
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        })
    }

    pub(crate) fn was_dropped(&self) -> bool {
        self.dropped.load(Ordering::SeqCst)
    }
}

/// A service answering 200 with the request's lock key (or `-` when unlocked) as its body.
pub(crate) fn echo_lock_key() -> impl TestService {
    tower::service_fn(|req: Request<String>| async move {
        let key = req
            .extensions()
            .get::<LockInfo>()
            .map_or_else(|| "-".to_owned(), |info| info.key().to_owned());
        Ok::<_, Infallible>(Response::new(key))
    })
}

/// The whole body as text.
pub(crate) async fn text<B>(body: B) -> String
where
    B: Body,
    B::Error: std::fmt::Debug,
{
    let bytes = body.collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The body parsed as JSON.
pub(crate) async fn json<B>(body: B) -> serde_json::Value
where
    B: Body,
    B::Error: std::fmt::Debug,
{
    serde_json::from_str(&text(body).await).unwrap()
}

/// Waits until the locker has `n` local waiters (no signal exists for it: checked every ms).
pub(crate) async fn until_waiters(locker: &Locker, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while locker.stats().waiters < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never saw {n} waiters: {:?}", locker.stats()));
}

/// A response body fed by the test through a channel.
pub(crate) struct ChannelBody(pub mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// A service whose responses stream through a channel; the sender of each response is sent
/// to the returned receiver.
pub(crate) fn streaming() -> (
    impl tower::Service<
        Request<String>,
        Response = Response<ChannelBody>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + Sync
    + 'static,
    mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>,
) {
    let (senders_tx, senders_rx) = mpsc::unbounded_channel();
    let svc = tower::service_fn(move |_req: Request<String>| {
        let senders_tx = senders_tx.clone();
        async move {
            let (tx, rx) = mpsc::channel(4);
            senders_tx.send(tx).unwrap();
            Ok::<_, Infallible>(Response::new(ChannelBody(rx)))
        }
    });
    (svc, senders_rx)
}

/// Acquires `key` within a few seconds: proves it was released (waiters are woken by the
/// release notification).
pub(crate) async fn assert_released(locker: &Locker, key: &str) {
    let guard = locker
        .lock(key)
        .wait(Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("{key} was not released: {e}"));
    guard.release().await.unwrap();
}

/// `fut`, or a test failure after 10 s (for awaits a broken layer would leave hanging).
pub(crate) async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Waits until `done()` holds, checking every 5 ms, failing after 10 s. For state that settles
/// on its own timer with no signal to wait on (lock-core keeps an emptied wait queue's release
/// subscription for a short while, for the next burst).
pub(crate) async fn eventually(what: &str, done: impl Fn() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}
