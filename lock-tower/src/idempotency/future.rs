//! [`IdempotencyFuture`]: the response future of [`IdempotencyService`](crate::IdempotencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use super::rejection::IdempotencyRejection;
use super::service::{Labels, reject};
use crate::body::ResponseBody;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The response future of [`IdempotencyService`](crate::IdempotencyService): reads the body,
/// looks the key up, replays, rejects, or runs the request under the key's lock and stores its
/// response. Dropping this future (the client went away, a timeout layer gave up) cancels the
/// handler with it and stores nothing; the key's "started" mark stays, so a retry is told
/// the outcome is unknown (409) and never runs it again; with
/// [`detach_handler`](crate::IdempotencyLayer::detach_handler) the handler runs in a task of
/// its own instead, until it ends or the key's lease is lost (then it is cancelled and nothing
/// is stored), and its stored response is replayed to the retry.
///
/// ```
/// # async fn demo() {
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
///
/// let inner = tower::service_fn(|_req: http::Request<Full<Bytes>>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("charged")))
/// });
/// let svc = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).layer(inner);
/// let request = || http::Request::post("/pay").header("idempotency-key", "k").body(Full::new(Bytes::new())).unwrap();
/// let first = svc.clone().oneshot(request()).await.unwrap();
/// assert!(first.headers().get("idempotent-replayed").is_none());
/// let retry = svc.oneshot(request()).await.unwrap();
/// assert_eq!(retry.headers()["idempotent-replayed"], "true");
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct IdempotencyFuture<B, E> {
    inner: BoxFuture<Result<Response<ResponseBody<B>>, E>>,
    /// Where its answer is counted (`lock_idempotency_requests_total`, feature `metrics`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    labels: Labels,
    /// The outcome of an answer that names none (see [`Answered`]): the handler's own
    /// response or error, passed on.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    otherwise: &'static str,
}

impl<B: Send + 'static, E: Send + 'static> IdempotencyFuture<B, E> {
    /// `future`'s answer, counted as the outcome it names, else as `otherwise`.
    pub(crate) fn new(
        labels: Labels,
        otherwise: &'static str,
        future: impl Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    ) -> Self {
        IdempotencyFuture {
            inner: Box::pin(future),
            labels,
            otherwise,
        }
    }

    pub(crate) fn rejected(labels: Labels, rejection: IdempotencyRejection) -> Self {
        Self::answered(labels, reject(&rejection))
    }

    pub(crate) fn answered(labels: Labels, response: Response<ResponseBody<B>>) -> Self {
        Self::new(labels, "error", std::future::ready(Ok(response)))
    }
}

impl<B, E> Future for IdempotencyFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        #[cfg_attr(not(feature = "metrics"), allow(unused_mut))]
        let mut output = std::task::ready!(self.inner.as_mut().poll(cx));
        // Counted here, once per answer, whichever path made it.
        #[cfg(feature = "metrics")]
        {
            let named = match &mut output {
                Ok(response) => response
                    .extensions_mut()
                    .remove::<super::service::Answered>(),
                Err(_) => None,
            };
            let outcome = named.map_or(self.otherwise, |a| a.0);
            ::metrics::counter!(
                "lock_idempotency_requests_total",
                "class" => self.labels.class,
                "backend" => self.labels.backend,
                "outcome" => outcome
            )
            .increment(1);
        }
        Poll::Ready(output)
    }
}

impl<B, E> fmt::Debug for IdempotencyFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyFuture").finish_non_exhaustive()
    }
}
