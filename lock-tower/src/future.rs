//! [`ResponseFuture`]: waits for the lock, runs the request under it, releases it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use lock_core::{LockError, LockRequest};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::hold::{Hold, Release};
use crate::key::LogKey;
use crate::metrics::Counter;
use crate::rejection::Rejection;
use crate::service::Shared;
use crate::{BodyError, FencingToken};

type Acquire = LockRequest;

pin_project! {
    /// The response future of [`LockService`](crate::LockService).
    ///
    /// In order: waits for the lock (bounded), calls the inner service with the request
    /// (carrying a [`FencingToken`] when fenced, and the lock's `lock_core::LockInfo`),
    /// drives its future while watching the lease, releases the lock, and resolves to the
    /// response. Dropping it at any point (client gone, a timeout layer above) gives up the
    /// wait or releases the lock. If the lease is lost while the inner future runs, that future
    /// is dropped and the answer is a 503 [`Rejection::LeaseLost`]; a response finished after
    /// the lease was lost is discarded the same way, and so is one whose release the backend
    /// answered with "not ours" (the key was deleted, expired or taken over since the last
    /// renewal).
    ///
    /// ```
    /// # async fn demo() {
    /// use tower::{Layer, Service, ServiceExt};
    /// use lock_tower::{LockLayer, ResponseFuture, extract::MethodAndPath};
    ///
    /// let inner = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let mut svc = LockLayer::new(lock_core::Locker::memory(), MethodAndPath).layer(inner);
    /// let future = svc.ready().await.unwrap().call(http::Request::new(String::new()));
    /// let response = future.await.unwrap();
    /// assert_eq!(response.status(), 200);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub struct ResponseFuture<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB>,
        shared: Arc<Shared>,
        span: tracing::Span,
        // A HEAD request: its response's body is never sent (nor polled by hyper).
        head: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Acquiring {
            acquire: Acquire,
            pending: Option<(S, Request<ReqB>)>,
            started: Instant,
        },
        Running {
            #[pin]
            future: Inner<S::Future>,
            hold: Option<Hold>,
        },
        Releasing {
            release: Release,
            output: Option<Result<S::Response, S::Error>>,
        },
        Rejected {
            rejection: Option<Rejection>,
        },
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn acquiring(
        shared: Arc<Shared>,
        acquire: Acquire,
        service: S,
        request: Request<ReqB>,
        key: &str,
    ) -> Self {
        let head = request.method() == http::Method::HEAD;
        let span = tracing::info_span!("lock_tower", key = %LogKey(key));
        span.in_scope(|| tracing::trace!(wait = ?shared.options.wait, "acquiring lock"));
        ResponseFuture {
            state: State::Acquiring {
                acquire,
                pending: Some((service, request)),
                started: Instant::now(),
            },
            shared,
            span,
            head,
        }
    }

    pub(crate) fn unlocked(shared: Arc<Shared>, future: S::Future) -> Self {
        ResponseFuture {
            state: State::Running {
                future: Inner::Plain { future },
                hold: None,
            },
            shared,
            span: tracing::Span::none(),
            head: false,
        }
    }

    pub(crate) fn rejected(shared: Arc<Shared>, rejection: Rejection) -> Self {
        ResponseFuture {
            state: State::Rejected {
                rejection: Some(rejection),
            },
            shared,
            span: tracing::Span::none(),
            head: false,
        }
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BodyError>,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        let shared = &**this.shared;
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    pending,
                    started,
                } => {
                    let acquired = ready!(Pin::new(acquire).poll(cx));
                    let Some((mut service, mut request)) = pending.take() else {
                        return Poll::Ready(Ok(shared.reject(&polled_after_completion())));
                    };
                    match acquired {
                        Ok(guard) => {
                            let now = Instant::now();
                            let waited = now.saturating_duration_since(*started);
                            shared.metrics.acquired(waited, guard.waited());
                            tracing::debug!(
                                acquire_us = waited.as_micros(),
                                waited = guard.waited(),
                                "lock acquired; calling the service"
                            );
                            if let Some(fence) = guard.fence() {
                                request.extensions_mut().insert(FencingToken(fence));
                            }
                            request.extensions_mut().insert(guard.info());
                            // Run inside the lock's scope: `lock_core::current_lock()` works in
                            // the handler, and locking the same key there is reentrant.
                            let future = Inner::Scoped {
                                future: guard.scope(service.call(request)),
                            };
                            let hold = Hold::new(guard, now, shared.metrics.clone());
                            State::Running {
                                future,
                                hold: Some(hold),
                            }
                        }
                        Err(error @ LockError::Backend { .. }) if shared.options.fail_open => {
                            shared.metrics.incr(Counter::FailedOpen);
                            tracing::warn!(%error, "lock backend failed; failing open: calling the service WITHOUT the lock");
                            State::Running {
                                future: Inner::Plain {
                                    future: service.call(request),
                                },
                                hold: None,
                            }
                        }
                        Err(error) => State::Rejected {
                            rejection: Some(Rejection::from_lock_error(error)),
                        },
                    }
                }
                StateProj::Running { future, hold } => {
                    // Never poll the service once the lease is gone; while it is pending, a
                    // loss must wake us (then its future is dropped).
                    let lost = hold.as_ref().is_some_and(|h| !h.is_held());
                    let polled = if lost { None } else { Some(future.poll(cx)) };
                    let output = match polled {
                        Some(Poll::Ready(output)) => Some(output),
                        Some(Poll::Pending) => {
                            if !hold.as_mut().is_some_and(|h| h.poll_lost(cx).is_ready()) {
                                return Poll::Pending;
                            }
                            None
                        }
                        None => None,
                    };
                    let Some(h) = hold.take() else {
                        // Unlocked (no key, or failing open): `output` is always there.
                        return match output {
                            Some(output) => Poll::Ready(output.map(|r| r.map(ResponseBody::new))),
                            None => Poll::Ready(Ok(shared.reject(&polled_after_completion()))),
                        };
                    };
                    match output {
                        None => lease_lost(h, "the service's future (dropped now)"),
                        Some(_) if !h.is_held() => {
                            lease_lost(h, "the service's future (its response is discarded)")
                        }
                        Some(Ok(response)) if shared.options.hold_until_body_end => {
                            match sent_body(&response, *this.head) {
                                Some(length) => {
                                    tracing::trace!(
                                        "response ready; the lock is held until its body ends"
                                    );
                                    shared.metrics.answered_locked();
                                    return Poll::Ready(Ok(
                                        response.map(|body| ResponseBody::holding(body, h, length))
                                    ));
                                }
                                None => State::Releasing {
                                    release: h.release(),
                                    output: Some(Ok(response)),
                                },
                            }
                        }
                        Some(output) => State::Releasing {
                            release: h.release(),
                            output: Some(output),
                        },
                    }
                }
                StateProj::Releasing { release, output } => {
                    let released = ready!(Pin::new(release).poll(cx));
                    return Poll::Ready(match (output.take(), released) {
                        // The backend found the lock lost at its release: the response is
                        // discarded, as for a loss seen before (a service error stays one).
                        (Some(Ok(_)), Err(lost)) => {
                            Ok(shared.reject(&Rejection::LeaseLost { key: lost.key }))
                        }
                        (Some(output), _) => {
                            shared.metrics.answered_locked();
                            output.map(|r| r.map(ResponseBody::new))
                        }
                        (None, _) => Ok(shared.reject(&polled_after_completion())),
                    });
                }
                StateProj::Rejected { rejection } => {
                    let rejection = rejection.take().unwrap_or_else(polled_after_completion);
                    return Poll::Ready(Ok(shared.reject(&rejection)));
                }
            };
            this.state.set(next);
        }
    }
}

pin_project! {
    /// The service's future: inside the lock's scope when locked, as is when not.
    #[project = InnerProj]
    enum Inner<F: Future> {
        Plain {
            #[pin]
            future: F,
        },
        Scoped {
            #[pin]
            future: lock_core::Scoped<F>,
        },
    }
}

impl<F: Future> Future for Inner<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.project() {
            InnerProj::Plain { future } => future.poll(cx),
            InnerProj::Scoped { future } => future.poll(cx),
        }
    }
}

/// Whether the server sends (and polls) the response's body, and the length it declares (its
/// `Content-Length`, or else its body's exact size hint: the server writes that many bytes and
/// may stop polling the body then). `None` for a HEAD request, a 1xx, 204 or 304 answer, an
/// empty body or a declared length of 0: only a body that is sent can hold the lock until it
/// ends; for the others the lock is released before the response goes out, and a release that
/// finds it lost turns the response into a 503.
fn sent_body<B: Body>(response: &Response<B>, head: bool) -> Option<Option<u64>> {
    let status = response.status();
    if head
        || status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED
        || response.body().is_end_stream()
    {
        return None;
    }
    let length = match response.headers().get(http::header::CONTENT_LENGTH) {
        Some(value) => value.to_str().ok().and_then(|v| v.trim().parse().ok()),
        None => response.body().size_hint().exact(),
    };
    (length != Some(0)).then_some(length)
}

/// The lease was lost while the request ran: the state that answers 503.
fn lease_lost<S, ReqB>(hold: Hold, during: &'static str) -> State<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    let key = hold.key().to_owned();
    hold.lost(during);
    State::Rejected {
        rejection: Some(Rejection::LeaseLost { key }),
    }
}

/// Futures must not be polled after they completed; answering 500 beats panicking.
fn polled_after_completion() -> Rejection {
    Rejection::Misconfigured {
        reason: "lock_tower::ResponseFuture was polled after it completed".into(),
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Running { hold: Some(_), .. } => "running locked",
            State::Running { hold: None, .. } => "running unlocked",
            State::Releasing { .. } => "releasing",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
