//! [`ResponseBody`]: the body of every response that went through the layer.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use pin_project_lite::pin_project;

use crate::hold::{Hold, Release};

/// The error type of [`ResponseBody`]: the service's body error, or [`LeaseLostError`].
///
/// ```
/// let error: lock_tower::BodyError = Box::new(lock_tower::LeaseLostError::new("k"));
/// assert!(error.is::<lock_tower::LeaseLostError>());
/// ```
pub type BodyError = Box<dyn std::error::Error + Send + Sync + 'static>;

pin_project! {
    /// The response body of [`LockService`](crate::LockService): the service's own body, or
    /// a rejection's body.
    ///
    /// With [`hold_until_body_end`](crate::LockLayer::hold_until_body_end) it also holds the
    /// lock until the body has ended or is dropped; if the lease is lost while it streams, the
    /// body ends with a [`LeaseLostError`] (the server then aborts the response, so the client
    /// sees an incomplete one rather than a complete-looking one). Its last frame waits for
    /// the release's answer: a release that finds the lock no longer ours ends it the same way.
    ///
    /// ```
    /// # async fn demo() {
    /// use http_body_util::BodyExt;
    /// use lock_tower::ResponseBody;
    ///
    /// let body = ResponseBody::new(String::from("hello"));
    /// let bytes = body.collect().await.unwrap().to_bytes();
    /// assert_eq!(bytes, "hello");
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo());
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            hold: Option<Hold>,
            // The body ended (or completed its declared length) and its lock is being
            // released: its last frame (data or trailers) waits for the answer, so that a lock
            // found lost then ends the body with an error instead of completing it. `true`
            // when the body ended; after a declared length, what follows (trailers) passes.
            releasing: Option<(Release, Option<Frame<Bytes>>, bool)>,
            // While held: the bytes still to come when the response declared its length
            // (a `Content-Length`, or an exact size hint). The frame that completes them is
            // the last one (hyper stops polling once it has written them).
            left: Option<u64>,
            // Over: nothing more comes (the lease was lost, or the last frame went out).
            failed: bool,
        },
        Full {
            data: Option<Bytes>,
            // Sent after the data (a stored response's trailers).
            trailers: Option<HeaderMap>,
        },
        Custom {
            body: UnsyncBoxBody<Bytes, BodyError>,
        },
        // A body whose head was already read (by the idempotency layer, up to the record's
        // limit): the head, then the rest as the service streams it.
        Rest {
            head: VecDeque<Bytes>,
            rest: Pin<Box<B>>,
        },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps a service's body, holding nothing.
    ///
    /// ```
    /// let body = lock_tower::ResponseBody::new(String::from("ok"));
    /// # drop(body);
    /// ```
    pub fn new(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner {
                body,
                hold: None,
                releasing: None,
                left: None,
                failed: false,
            },
        }
    }

    /// `body`, holding `hold` until it ends; `length` is the response's declared length.
    pub(crate) fn holding(body: B, hold: Hold, length: Option<u64>) -> Self {
        ResponseBody {
            kind: Kind::Inner {
                body,
                hold: Some(hold),
                releasing: None,
                left: length,
                failed: false,
            },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, HeaderMap::new())
    }

    /// `data`, then `trailers` when there are any.
    pub(crate) fn full_with_trailers(data: Bytes, trailers: HeaderMap) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
                trailers: (!trailers.is_empty()).then_some(trailers),
            },
        }
    }

    /// `head`, read from `rest` already, then what `rest` still has.
    pub(crate) fn rest(head: VecDeque<Bytes>, rest: Pin<Box<B>>) -> Self {
        ResponseBody {
            kind: Kind::Rest { head, rest },
        }
    }

    pub(crate) fn custom(body: UnsyncBoxBody<Bytes, BodyError>) -> Self {
        ResponseBody {
            kind: Kind::Custom { body },
        }
    }

    /// Whether this body still holds a request's lock.
    ///
    /// ```
    /// assert!(!lock_tower::ResponseBody::new(String::new()).holds_lock());
    /// ```
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Inner { hold: Some(_), .. })
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BodyError>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.project().kind.project() {
            KindProj::Inner {
                mut body,
                hold,
                releasing,
                left,
                failed,
            } => loop {
                if *failed {
                    return Poll::Ready(None);
                }
                if let Some((release, last, ended)) = releasing {
                    let released = ready!(Pin::new(release).poll(cx));
                    let (last, ended) = (last.take(), *ended);
                    *releasing = None;
                    return Poll::Ready(match released {
                        Ok(()) => {
                            *failed = ended;
                            last.map(Ok)
                        }
                        Err(lost) => {
                            *failed = true;
                            Some(Err(Box::new(LeaseLostError { key: lost.key })))
                        }
                    });
                }
                if hold.as_ref().is_some_and(|h| !h.is_held()) {
                    return fail(hold, failed);
                }
                let Poll::Ready(frame) = body.as_mut().poll_frame(cx) else {
                    if hold.as_mut().is_some_and(|h| h.poll_lost(cx).is_ready()) {
                        return fail(hold, failed);
                    }
                    return Poll::Pending;
                };
                let (last, ended) = match frame {
                    Some(Ok(frame)) if body.is_end_stream() => (Some(frame), true),
                    Some(Ok(frame)) if hold.is_some() && completes(left, &frame) => {
                        (Some(frame), false)
                    }
                    Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                    None => (None, true),
                    Some(Err(error)) => {
                        // Dropping the hold releases the lock (in the background).
                        drop(hold.take());
                        return Poll::Ready(Some(Err(error.into())));
                    }
                };
                let Some(h) = hold.take() else {
                    return Poll::Ready(last.map(Ok));
                };
                // The body ended, or completed its declared length: its last frame goes out
                // once the release says the lock was ours until then (else the body fails, and
                // the response is incomplete).
                *releasing = Some((h.release(), last, ended));
            },
            KindProj::Full { data, trailers } => Poll::Ready(match data.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
            KindProj::Custom { body } => Pin::new(body).poll_frame(cx),
            KindProj::Rest { head, rest } => match head.pop_front() {
                Some(head) => Poll::Ready(Some(Ok(Frame::data(head)))),
                None => rest
                    .as_mut()
                    .poll_frame(cx)
                    .map(|f| f.map(|f| f.map_err(Into::into))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner {
                body,
                hold,
                releasing,
                failed,
                ..
            } => *failed || (hold.is_none() && releasing.is_none() && body.is_end_stream()),
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Custom { body } => body.is_end_stream(),
            Kind::Rest { head, rest } => head.is_empty() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data, trailers } => {
                let len = data.as_ref().map_or(0, |d| d.len() as u64);
                match trailers {
                    None => SizeHint::with_exact(len),
                    // Not exact: HTTP/1 would declare a `Content-Length`, which leaves
                    // trailers no place (hyper drops them); chunked, they go out.
                    Some(_) => {
                        let mut hint = SizeHint::new();
                        hint.set_lower(len);
                        hint
                    }
                }
            }
            Kind::Custom { body } => body.size_hint(),
            Kind::Rest { head, rest } => {
                let head = head.iter().map(|c| c.len() as u64).sum();
                shifted_hint(&rest.size_hint(), head, 0)
            }
        }
    }
}

/// `hint` with `plus` bytes more and `minus` fewer, saturating (a hint may say `u64::MAX`).
pub(crate) fn shifted_hint(hint: &SizeHint, plus: u64, minus: u64) -> SizeHint {
    let shift = |n: u64| n.saturating_add(plus).saturating_sub(minus);
    let mut shifted = SizeHint::new();
    shifted.set_lower(shift(hint.lower()));
    if let Some(upper) = hint.upper() {
        shifted.set_upper(shift(upper));
    }
    shifted
}

/// Whether `frame` completes the declared length (`left` bytes still to come); counts it.
fn completes(left: &mut Option<u64>, frame: &Frame<Bytes>) -> bool {
    let (Some(n), Some(data)) = (left.as_mut(), frame.data_ref()) else {
        return false;
    };
    *n = n.saturating_sub(data.len() as u64);
    *n == 0
}

/// The lease was lost while the body streamed: end the body with an error.
fn fail(
    hold: &mut Option<Hold>,
    failed: &mut bool,
) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    *failed = true;
    let Some(h) = hold.take() else {
        return Poll::Ready(None);
    };
    let key = h.key().to_owned();
    h.lost("the response body");
    Poll::Ready(Some(Err(Box::new(LeaseLostError { key }))))
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "service",
            Kind::Full { .. } => "rejection",
            Kind::Custom { .. } => "custom rejection",
            Kind::Rest { .. } => "service, its head read",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("holds_lock", &self.holds_lock())
            .finish()
    }
}

/// The error a held response body ends with when the lease is lost while it streams (see
/// [`hold_until_body_end`](crate::LockLayer::hold_until_body_end)).
///
/// ```
/// let e = lock_tower::LeaseLostError::new("reserve:42");
/// assert_eq!(e.key(), "reserve:42");
/// assert!(e.to_string().contains("lost"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLostError {
    key: String,
}

impl LeaseLostError {
    /// An error for the lock `key`.
    ///
    /// ```
    /// let e = lock_tower::LeaseLostError::new("k");
    /// # drop(e);
    /// ```
    pub fn new(key: impl Into<String>) -> Self {
        LeaseLostError { key: key.into() }
    }

    /// The lock key.
    ///
    /// ```
    /// assert_eq!(lock_tower::LeaseLostError::new("k").key(), "k");
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for LeaseLostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the lease on lock {:?} was lost while the response body was streaming; the response is incomplete",
            crate::key::LogKey(&self.key)
        )
    }
}

impl std::error::Error for LeaseLostError {}
