//! [`IdempotencyService`]: the service made by [`IdempotencyLayer`](crate::IdempotencyLayer),
//! and the steps one idempotent request goes through.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use lock_core::{IdempotencyState, LockError, LockGuard, MAX_RESULT_LEN};
use sha2::{Digest, Sha256};
use tower_service::Service;

use super::future::IdempotencyFuture;
use super::key_header;
use super::layer::{Config, Scope, caller_principal};
use super::record::Stored;
use super::rejection::IdempotencyRejection;
use crate::BodyError;
use crate::body::{ResponseBody, shifted_hint};
use crate::key::LogKey;

/// The header set on replayed responses.
pub(crate) const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Runs each keyed request at most once per key and replays its response; made by
/// [`IdempotencyLayer`](crate::IdempotencyLayer). See the [module docs](crate::idempotency).
///
/// `poll_ready` is the inner service's; the inner service made ready is the one called.
/// Rejections are responses; the error type is the inner service's.
///
/// ```
/// use tower::Layer;
/// let svc = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).layer(7_u8);
/// assert_eq!(*svc.get_ref(), 7);
/// ```
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn from_parts(inner: S, config: Arc<Config>) -> Self {
        IdempotencyService { inner, config }
    }

    /// The inner service.
    ///
    /// ```
    /// use tower::Layer;
    /// let svc = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).layer(7_u8);
    /// assert_eq!(*svc.get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// ```
    /// use tower::Layer;
    /// let mut svc = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).layer(7_u8);
    /// *svc.get_mut() = 8;
    /// assert_eq!(*svc.get_ref(), 8);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, taken out.
    ///
    /// ```
    /// use tower::Layer;
    /// let svc = lock_tower::IdempotencyLayer::new(lock_core::Locker::memory()).layer(7_u8);
    /// assert_eq!(svc.into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BodyError> + Send,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BodyError> + Send,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = IdempotencyFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let config = self.config.clone();
        let clone = self.inner.clone();
        let mut service = std::mem::replace(&mut self.inner, clone);
        let (mut parts, body) = request.into_parts();
        // Two keys are not one: taking either would replay or run the wrong request. Two
        // header lines and one line listing two keys are the same to HTTP (RFC 9110 5.3: a
        // proxy may join them).
        let header = match &config.header {
            Ok(header) => header,
            Err(name) => {
                // Before the handler: no request can be told apart from one with a key.
                return IdempotencyFuture::rejected(
                    config.labels,
                    IdempotencyRejection::Misconfigured {
                        reason: format!(
                            "IdempotencyLayer::header({name:?}) is not a valid header name"
                        ),
                    },
                );
            }
        };
        let mut values = parts.headers.get_all(header).iter();
        let several = match (values.next(), values.next()) {
            (Some(_), Some(_)) => Some("is repeated"),
            (Some(value), None) if lists_several(value.as_bytes()) => Some("lists several keys"),
            _ => None,
        };
        if let Some(how) = several {
            return IdempotencyFuture::rejected(
                config.labels,
                IdempotencyRejection::InvalidKey {
                    reason: format!("the {header} header {how}; send one key").into(),
                },
            );
        }
        // The draft's sf-string (`"abc"`) and the bare value (`abc`) are one key.
        let key = match parts
            .headers
            .get(header)
            .map(|v| key_header::parse(v.as_bytes()))
        {
            None => None,
            Some(Ok(key)) => Some(key.into_owned()).filter(|k| !k.is_empty()),
            Some(Err(why)) => {
                return IdempotencyFuture::rejected(
                    config.labels,
                    IdempotencyRejection::InvalidKey {
                        reason: format!("the {header} header is malformed: {why}").into(),
                    },
                );
            }
        };
        let Some(key) = key else {
            if config.require_key {
                return IdempotencyFuture::answered(config.labels, missing_key(header));
            }
            let future = service.call(Request::from_parts(parts, body));
            return IdempotencyFuture::new(config.labels, "passed_through", async move {
                future.await.map(|r| r.map(ResponseBody::new))
            });
        };
        if let Err(reason) = config.check_ttl() {
            // Before the handler: a result that cannot be stored must not be produced.
            return IdempotencyFuture::rejected(
                config.labels,
                IdempotencyRejection::Misconfigured { reason },
            );
        }
        let principal = match &config.scope {
            Scope::Shared => Vec::new(),
            Scope::Caller => caller_principal(&parts.headers),
            Scope::Custom(scope) => match scope.extract(&mut parts) {
                Ok(p) => p.map(|p| p.as_bytes().to_vec()).unwrap_or_default(),
                Err(e) if e.is_misconfigured() => {
                    return IdempotencyFuture::rejected(
                        config.labels,
                        IdempotencyRejection::Misconfigured {
                            reason: e.reason().to_owned(),
                        },
                    );
                }
                Err(e) => {
                    return IdempotencyFuture::rejected(
                        config.labels,
                        IdempotencyRejection::InvalidKey {
                            reason: e.reason().to_owned().into(),
                        },
                    );
                }
            },
        };
        let Some(record_key) = config.record_key(&principal, &key) else {
            return IdempotencyFuture::rejected(config.labels, IdempotencyRejection::MissingKey);
        };
        // The handler's own answers (an error, a response not stored) name no outcome.
        IdempotencyFuture::new(config.labels, "unstored", async move {
            let request = match read_body(parts, body, config.max_body).await {
                Ok(request) => request,
                Err(rejection) => return Ok(reject(&rejection)),
            };
            run(config, service, request, record_key).await
        })
    }
}

/// 400 for a request without its key, the detail naming the layer's key header (a client told
/// to send `Idempotency-Key` to a layer that reads another header would be turned away again).
fn missing_key<B>(header: &HeaderName) -> Response<ResponseBody<B>> {
    let rejection = IdempotencyRejection::MissingKey;
    if header.as_str() == "idempotency-key" {
        return reject(&rejection);
    }
    let detail = format!(
        "This request must carry a {header} header (its idempotency key), and it carries none."
    );
    let response = rejection
        .to_response_saying(&detail)
        .map(|json| ResponseBody::full(Bytes::from(json)));
    answered(response, "bad_request")
}

/// Whether a key header's value lists several keys (`a, b`). A comma in a quoted string
/// (`"a, b"`, the IETF draft's form of the key) is part of one key.
fn lists_several(value: &[u8]) -> bool {
    let (mut quoted, mut escaped) = (false, false);
    for &byte in value {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b',' if !quoted => return true,
            _ => {}
        }
    }
    false
}

/// Reads the body (bounded) and rebuilds the request around it, with its fingerprint.
async fn read_body<ReqB>(
    parts: http::request::Parts,
    body: ReqB,
    max: usize,
) -> Result<(Request<ReqB>, String), IdempotencyRejection>
where
    ReqB: Body + From<Bytes>,
    ReqB::Error: Into<BodyError>,
{
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max as u64) {
        return Err(IdempotencyRejection::BodyTooLarge { limit: max });
    }
    let bytes = match Limited::new(body, max).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return Err(IdempotencyRejection::BodyTooLarge { limit: max });
        }
        Err(_) => return Err(IdempotencyRejection::BodyUnreadable),
    };
    let fingerprint = fingerprint(&parts, &bytes);
    Ok((Request::from_parts(parts, ReqB::from(bytes)), fingerprint))
}

/// `v2:` and the SHA-256 of the method, the route it was routed to (axum), the path (as the
/// client sent it, normalized: see `uri.rs`), the query and the body, each field written as
/// its length and its bytes, or as absent: two different requests never hash the same bytes,
/// whatever their bodies hold (with `v1:`'s separators, an unrouted request whose body began
/// with its path and a newline hashed like a routed one).
fn fingerprint(parts: &http::request::Parts, body: &[u8]) -> String {
    /// `0` for an absent field, else `1`, the length (8 bytes, big-endian) and the bytes: a
    /// prefix-free encoding that allocates nothing.
    fn field(hash: &mut Sha256, bytes: Option<&[u8]>) {
        match bytes {
            None => hash.update([0]),
            Some(bytes) => {
                hash.update([1]);
                hash.update((bytes.len() as u64).to_be_bytes());
                hash.update(bytes);
            }
        }
    }
    let uri = crate::uri::original_uri(parts);
    let mut hash = Sha256::new();
    field(&mut hash, Some(parts.method.as_str().as_bytes()));
    // Two handlers' requests are two requests, whatever their paths normalize to: one key
    // used for both is reused for another request (422), never replayed across them.
    field(
        &mut hash,
        crate::uri::matched_route(parts).map(str::as_bytes),
    );
    let path = crate::uri::normalized_path(uri.path(), crate::uri::Decode::Unreserved);
    field(&mut hash, Some(path.as_bytes()));
    field(&mut hash, uri.query().map(str::as_bytes));
    field(&mut hash, Some(body));
    let mut out = String::with_capacity(67);
    out.push_str("v2:");
    crate::key::push_hex(&mut out, &hash.finalize());
    out
}

/// One keyed request: replay, reject, or run under the key's lock and store.
async fn run<S, ReqB, ResB>(
    config: Arc<Config>,
    service: S,
    (request, fingerprint): (Request<ReqB>, String),
    key: String,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BodyError> + Send,
{
    let locker = &config.locker;
    // The common retry: one read, no lock.
    match locker.idempotency_state(&key).await {
        Ok(IdempotencyState::Completed(record)) => {
            return Ok(answer_from_record(
                &key,
                &record.fingerprint,
                &record.result,
                &fingerprint,
            ));
        }
        Ok(IdempotencyState::Started {
            fingerprint: theirs,
            ..
        }) => return Ok(reject(&started(&theirs, &fingerprint))),
        Ok(IdempotencyState::InFlight) if config.wait.is_none() => {
            return Ok(reject(&IdempotencyRejection::InFlight));
        }
        Ok(_) => {}
        Err(error) => return Ok(reject(&from_lock_error(&key, error))),
    }
    let lock = match config.wait {
        Some(wait) => locker.lock(&key).class(config.labels.class).wait(wait),
        None => locker.lock(&key).class(config.labels.class).no_wait(),
    };
    let guard = match lock.await {
        Ok(guard) => guard,
        Err(error) => return Ok(reject(&from_lock_error(&key, error))),
    };
    // Under the lock, ask again: the first request may have finished meanwhile.
    match locker.idempotency_state(&key).await {
        Ok(IdempotencyState::Completed(record)) => {
            release(guard).await;
            return Ok(answer_from_record(
                &key,
                &record.fingerprint,
                &record.result,
                &fingerprint,
            ));
        }
        Ok(IdempotencyState::Started {
            fingerprint: theirs,
            ..
        }) => {
            release(guard).await;
            return Ok(reject(&started(&theirs, &fingerprint)));
        }
        Ok(_) => {}
        Err(error) => {
            release(guard).await;
            return Ok(reject(&from_lock_error(&key, error)));
        }
    }
    // At most once: the durable "started" mark before the handler. Not written, the handler
    // does not run (503, safe to retry); a mark there already is a request that started and
    // recorded nothing: its outcome is unknown, and the handler never runs again for it.
    if let Err(error) = guard.mark_started(&fingerprint, config.ttl).await {
        release(guard).await;
        return Ok(reject(&match error {
            LockError::OutcomeUnknown {
                fingerprint: theirs,
                ..
            } => started(&theirs, &fingerprint),
            LockError::LeaseLost { .. } => IdempotencyRejection::Unavailable,
            error => from_lock_error(&key, error),
        }));
    }
    if !config.detach {
        // Dropped mid-handler, this future cancels the handler as every layer above expects
        // (a LockLayer outside must never see its handler outlive its lock); the guard's drop
        // releases the key's lock and nothing is stored.
        return complete(config.clone(), service, request, guard, key, fingerprint).await;
    }
    // Detached: the work runs in its own task. If this future is dropped (the client went
    // away, a timeout layer above gave up), the handler still runs to its end (or to a lease
    // loss, which `complete` answers with 503), its response is stored and the lock released,
    // so a retry replays it (or gets 409 while it runs) instead of running it a second time.
    let task = tokio::spawn(complete(
        config.clone(),
        service,
        request,
        guard,
        key,
        fingerprint,
    ));
    match task.await {
        Ok(outcome) => outcome,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => Ok(reject(&IdempotencyRejection::Unavailable)),
    }
}

/// Runs the handler under `guard`, stores its response, releases the lock.
async fn complete<S, ReqB, ResB>(
    config: Arc<Config>,
    mut service: S,
    mut request: Request<ReqB>,
    guard: LockGuard,
    key: String,
    fingerprint: String,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BodyError> + Send,
{
    let key = key.as_str();
    request.extensions_mut().insert(guard.info());
    // The handler runs while the lease is ours, never after: a loss (the lock gone from the
    // server, a partition longer than the lease) drops its future at once, as `LockLayer`
    // does, before a retry can take the freed key and run it a second time beside it.
    let called = until_lost(&guard, guard.scope(service.call(request))).await;
    let response = match called {
        Some(Ok(response)) => response,
        Some(Err(error)) => {
            // Not stored, like a 5xx: a retry runs again.
            unmark(&guard, key).await;
            release(guard).await;
            return Err(error);
        }
        None => return Ok(lease_lost(guard, key).await),
    };
    let (parts, body) = response.into_parts();
    if !storable(parts.status) || !grpc_storable(&parts.headers) {
        // Not stored: the mark is taken back, so a retry runs again.
        unmark(&guard, key).await;
        release(guard).await;
        return Ok(Response::from_parts(parts, ResponseBody::new(body)));
    }
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let reading = read_response(body, declared, MAX_RESULT_LEN);
    let Some(read) = until_lost(&guard, reading).await else {
        return Ok(lease_lost(guard, key).await);
    };
    let (stored, answer) = match read {
        Read::Whole(body, trailers) if !grpc_storable(&trailers) => {
            // A gRPC error, told at the end: not stored, the mark taken back, a retry runs
            // again.
            unmark(&guard, key).await;
            release(guard).await;
            let body = ResponseBody::full_with_trailers(body, trailers);
            return Ok(Response::from_parts(parts, body));
        }
        Read::Whole(body, trailers) => {
            let stored = Stored::Response {
                status: parts.status,
                headers: end_to_end(&parts.headers),
                body: body.clone(),
                trailers: trailers.clone(),
            };
            (stored, Ok(ResponseBody::full_with_trailers(body, trailers)))
        }
        Read::Over { head, rest } => {
            // Never held in memory whole: the head read so far, then the rest as the handler
            // streams it. The handler ran: a retry gets 409, never a second run.
            tracing::warn!(key = %LogKey(key), "response too large to store: later duplicates get 409 not-stored");
            let stored = Stored::TooLarge {
                status: parts.status,
            };
            let body = match config.detach {
                // The handler runs to its end whether the client listens or not: so does its
                // body (a task reads it to its end).
                true => ResponseBody::custom(UnsyncBoxBody::new(Forwarded::spawn(head, rest))),
                false => ResponseBody::rest(head, rest),
            };
            (stored, Ok(body))
        }
        Read::Failed => {
            // The handler ran: record that, so a retry does not run it again.
            tracing::warn!(key = %LogKey(key), "the handler's response body failed: later duplicates get 409 not-stored");
            (
                Stored::TooLarge {
                    status: parts.status,
                },
                Err(IdempotencyRejection::Misconfigured {
                    reason: "the handler's response body failed".into(),
                }),
            )
        }
    };
    let encoded = stored
        .encode()
        .filter(|bytes| bytes.len() <= MAX_RESULT_LEN)
        .or_else(|| {
            tracing::warn!(key = %LogKey(key), "response too large to store: later duplicates get 409 not-stored");
            Stored::TooLarge { status: parts.status }.encode()
        });
    let outcome = match encoded {
        None => Some(IdempotencyRejection::Misconfigured {
            reason: "the response could not be encoded".into(),
        }),
        Some(bytes) => match guard.store_result(&fingerprint, &bytes, config.ttl).await {
            Ok(()) => None,
            Err(LockError::LeaseLost { .. }) => {
                tracing::warn!(key = %LogKey(key), "lease lost before the response was stored: answering 503");
                Some(IdempotencyRejection::LeaseLost)
            }
            Err(error @ LockError::Backend { .. }) => {
                tracing::warn!(key = %LogKey(key), %error, "storing the response failed: answering 503");
                Some(IdempotencyRejection::Unavailable)
            }
            Err(error) => Some(IdempotencyRejection::Misconfigured {
                reason: error.to_string(),
            }),
        },
    };
    release(guard).await;
    Ok(match (outcome, answer) {
        (None, Ok(body)) => answered(Response::from_parts(parts, body), "stored"),
        (Some(rejection), _) | (None, Err(rejection)) => reject(&rejection),
    })
}

/// A handler's response body, read for its record.
enum Read<B> {
    /// All of it, at most the record's limit, and its trailers (empty when it had none).
    Whole(Bytes, HeaderMap),
    /// Longer than the limit (or declared so): the chunks read of it, and the rest, unread.
    Over {
        head: VecDeque<Bytes>,
        rest: Pin<Box<B>>,
    },
    /// It failed while it was read (its error is not kept: it may not be `Send`, and this
    /// future may be spawned).
    Failed,
}

/// Reads `body` up to `limit` bytes of data. A longer body (or one whose `Content-Length`,
/// `declared`, or size hint says so) is never buffered whole (a large download, an endless
/// stream behind an idempotency key): its head goes to the client and the rest streams after
/// it. The trailers of a body that fits are kept, to be sent after it and stored with it; a
/// longer body's trailers stream on with it.
async fn read_response<B: Body<Data = Bytes>>(
    body: B,
    declared: Option<u64>,
    limit: usize,
) -> Read<B> {
    let mut body = Box::pin(body);
    let mut head = VecDeque::new();
    let longer = |len: u64| len > limit as u64;
    if declared.is_some_and(longer) || longer(body.size_hint().lower()) {
        return Read::Over { head, rest: body };
    }
    let (mut len, mut trailers) = (0, HeaderMap::new());
    loop {
        match body.frame().await {
            None => break,
            Some(Err(_)) => return Read::Failed,
            Some(Ok(frame)) => {
                let data = match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        if let Ok(more) = frame.into_trailers() {
                            trailers.extend(more);
                        }
                        continue;
                    }
                };
                len += data.len();
                head.push_back(data);
                if len > limit {
                    return Read::Over { head, rest: body };
                }
            }
        }
    }
    let body = match head.len() {
        0 | 1 => head.pop_front().unwrap_or_default(),
        _ => Bytes::from(head.make_contiguous().concat()),
    };
    Read::Whole(body, trailers)
}

/// The rest of a detached handler's long body, read to its end by a task of its own: the
/// client gets its frames (after the head) while it listens, and the rest is read and dropped
/// if it goes away.
struct Forwarded {
    head: VecDeque<Bytes>,
    frames: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BodyError>>,
    /// The body's size hint when it was split, less what went out since.
    hint: SizeHint,
    done: bool,
}

impl Forwarded {
    fn spawn<B>(head: VecDeque<Bytes>, rest: Pin<Box<B>>) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BodyError> + Send,
    {
        let read = head.iter().map(|c| c.len() as u64).sum();
        let hint = shifted_hint(&rest.size_hint(), read, 0);
        let (tx, frames) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            let (mut rest, mut client) = (rest, Some(tx));
            while let Some(frame) = rest.frame().await {
                let frame = frame.map_err(Into::into);
                let failed = frame.is_err();
                if let Some(to) = &client
                    && to.send(frame).await.is_err()
                {
                    client = None; // Gone: read on, drop the frames.
                }
                if failed {
                    break;
                }
            }
        });
        Forwarded {
            head,
            frames,
            hint,
            done: false,
        }
    }
}

impl Body for Forwarded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let frame = match this.head.pop_front() {
            Some(chunk) => Some(Ok(Frame::data(chunk))),
            None if this.done => None,
            None => match this.frames.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(frame) => frame,
            },
        };
        match &frame {
            Some(Ok(frame)) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                this.hint = shifted_hint(&this.hint, 0, len);
            }
            Some(Err(_)) | None => this.done = true,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

/// Whether a response is stored and replayed: not 5xx (a retry runs again); not the 4xx
/// answers to a request that failed before it was processed, which the IETF draft does not ask
/// to store and which a layer over a whole router would otherwise keep for every key anyone
/// sends (issue 29, item 15): 400 (malformed: an extractor's rejection), 404 and 405 (no such
/// route or method: the router's), 413, 414, 415 and 431 (too large, unsupported); and not
/// the 4xx answers that say "not now" or "send it again" rather than "this request's answer":
/// 401 (credentials, often from an authentication layer inside this one), 408 (request
/// timeout), 429 (rate limited), 421 and 425 (misdirected, too early: user agents retry them
/// on their own, with the same key), 411, 417 and 428 (send it with a length, without the
/// expectation, with a precondition: headers the fingerprint does not cover, so a replay
/// would refuse the corrected retry); nor 307 and 308, which send the same request, key
/// included, to another path (stored, that request would be a key reused: 422). 301, 302
/// and 303 may follow work done (a form post's answer) and are stored. The layer cannot tell
/// a handler's own 400 or 404 from a router's, so those are not stored either: a retry runs
/// the handler again, as it should when that answer means nothing was done. Other 4xx answers (402, 403, 409, 410, 422...) are the handler's verdict
/// on the request and are replayed.
fn storable(status: http::StatusCode) -> bool {
    const NOT_STORED: [u16; 17] = [
        307, 308, 400, 401, 404, 405, 408, 411, 413, 414, 415, 417, 421, 425, 428, 429, 431,
    ];
    !status.is_server_error() && !NOT_STORED.contains(&status.as_u16())
}

/// Whether a gRPC answer is stored, told by its `grpc-status` (a trailer, or a header of a
/// trailers-only answer; none: not gRPC, stored) read as the HTTP status gRPC maps it to
/// (google.rpc.Code), then as [`storable`] says: `OK` and verdicts such as `ALREADY_EXISTS`
/// (409) or `PERMISSION_DENIED` (403) are stored; `UNAVAILABLE` (503), `INTERNAL` (500),
/// `UNIMPLEMENTED` (501, a gRPC router's "no such method"), `RESOURCE_EXHAUSTED` (429),
/// `INVALID_ARGUMENT` (400), `CANCELLED`, an unknown code or an unreadable one are not. A
/// body longer than a record is recorded "ran, not stored" before its trailers arrive.
fn grpc_storable(fields: &HeaderMap) -> bool {
    let Some(code) = fields.get("grpc-status") else {
        return true;
    };
    let http = match code.as_bytes() {
        b"0" => 200,
        b"3" | b"9" | b"11" => 400,
        b"16" => 401,
        b"7" => 403,
        b"5" => 404,
        b"6" | b"10" => 409,
        b"8" => 429,
        // CANCELLED (499, the client's), UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL,
        // UNAVAILABLE, DATA_LOSS, and what no gRPC server sends.
        _ => 500,
    };
    http::StatusCode::from_u16(http).is_ok_and(storable)
}

/// `work`'s output, or `None` when the lease was lost first (`work` is then dropped).
async fn until_lost<F: Future>(guard: &LockGuard, work: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        () = guard.lost() => None,
        output = work => Some(output),
    }
}

/// The answer when the lease was lost while the handler ran: 503, nothing stored (the store
/// would be refused), the handler's future dropped.
async fn lease_lost<B>(guard: LockGuard, key: &str) -> Response<ResponseBody<B>> {
    tracing::warn!(key = %LogKey(key), "lease lost while the handler ran: handler cancelled, answering 503");
    release(guard).await;
    reject(&IdempotencyRejection::LeaseLost)
}

/// Takes the "started" mark back (owner-checked) after a response that is not stored. If that
/// fails, the key answers "outcome unknown" until its TTL ends: never a second run.
async fn unmark(guard: &LockGuard, key: &str) {
    if let Err(error) = guard.clear_started().await {
        tracing::warn!(key = %LogKey(key), %error, "removing the started mark failed: duplicates get 409 outcome-unknown until it expires");
    }
}

/// The answer to a request finding a "started" mark without a result: 422 for another
/// request under the key, else 409 outcome unknown.
fn started(theirs: &str, fingerprint: &str) -> IdempotencyRejection {
    if theirs == fingerprint {
        IdempotencyRejection::OutcomeUnknown
    } else {
        IdempotencyRejection::Mismatch
    }
}

async fn release(guard: LockGuard) {
    if let Err(error) = guard.release().await {
        tracing::debug!(%error, "idempotency lock release failed; its lease will expire");
    }
}

/// The answer to a request finding a stored record.
fn answer_from_record<B>(
    key: &str,
    stored_fingerprint: &str,
    result: &[u8],
    fingerprint: &str,
) -> Response<ResponseBody<B>> {
    if stored_fingerprint != fingerprint {
        return reject(&IdempotencyRejection::Mismatch);
    }
    match Stored::decode(result) {
        Ok(Stored::Response {
            status,
            headers,
            body,
            trailers,
        }) => {
            let mut response = Response::new(ResponseBody::full_with_trailers(body, trailers));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
                .headers_mut()
                .insert(REPLAYED, HeaderValue::from_static("true"));
            answered(response, "replayed")
        }
        Ok(Stored::TooLarge { status }) => reject(&IdempotencyRejection::NotStored { status }),
        Err(error) => {
            tracing::error!(key = %LogKey(key), reason = error.0, "stored idempotency record unreadable");
            reject(&IdempotencyRejection::Misconfigured {
                reason: format!("stored record unreadable: {}", error.0),
            })
        }
    }
}

/// The headers worth storing: all but the hop-by-hop ones (RFC 9110 7.6.1) and those the
/// `Connection` header names. `Trailer` is end-to-end (RFC 9110 6.6.2) and kept: it names the
/// stored trailers, and hyper sends HTTP/1 trailers only when it does.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    const HOP_BY_HOP: [&str; 7] = [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "transfer-encoding",
    ];
    let named: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || n == "upgrade" || named.iter().any(|m| m == n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

fn from_lock_error(key: &str, error: LockError) -> IdempotencyRejection {
    match error {
        LockError::Busy { .. } | LockError::Timeout { .. } => IdempotencyRejection::InFlight,
        LockError::LeaseLost { .. } => IdempotencyRejection::LeaseLost,
        LockError::Backend { .. } => {
            tracing::warn!(key = %LogKey(key), %error, "lock backend failed: idempotent request rejected (503)");
            IdempotencyRejection::Unavailable
        }
        error => IdempotencyRejection::Misconfigured {
            reason: error.to_string(),
        },
    }
}

pub(crate) fn reject<B>(rejection: &IdempotencyRejection) -> Response<ResponseBody<B>> {
    if let IdempotencyRejection::Misconfigured { reason } = rejection {
        tracing::error!(%reason, "idempotency layer failed (500)");
    }
    let outcome = match rejection {
        IdempotencyRejection::Mismatch => "mismatch",
        IdempotencyRejection::InFlight
        | IdempotencyRejection::OutcomeUnknown
        | IdempotencyRejection::NotStored { .. } => "conflict",
        IdempotencyRejection::MissingKey
        | IdempotencyRejection::InvalidKey { .. }
        | IdempotencyRejection::BodyUnreadable
        | IdempotencyRejection::BodyTooLarge { .. } => "bad_request",
        IdempotencyRejection::Unavailable
        | IdempotencyRejection::LeaseLost
        | IdempotencyRejection::Misconfigured { .. } => "error",
    };
    let response = rejection
        .to_response()
        .map(|json| ResponseBody::full(Bytes::from(json)));
    answered(response, outcome)
}

impl<S: Clone> Clone for IdempotencyService<S> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

/// The labels of one idempotency layer's answers (`lock_idempotency_requests_total`, feature
/// `metrics`): its class and its locker's backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Labels {
    pub(crate) class: &'static str,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) backend: &'static str,
}

/// The outcome an answer of the idempotency layer names, taken off the response and counted by
/// [`IdempotencyFuture`] (once per answer, whichever path made it): `stored` (the handler ran,
/// its response stored), `replayed`, `conflict` (409: in flight, outcome unknown, response not
/// stored), `mismatch` (422), `bad_request`, `error`. An answer without one is the handler's
/// own, not stored (`unstored`), or a request without a key (`passed_through`).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Answered(pub(crate) &'static str);

/// `response`, naming its outcome (feature `metrics`; without it, as it is).
fn answered<B>(response: Response<B>, outcome: &'static str) -> Response<B> {
    #[cfg(feature = "metrics")]
    {
        let mut response = response;
        response.extensions_mut().insert(Answered(outcome));
        response
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = outcome;
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_outside_quotes_lists_several_keys() {
        assert!(lists_several(b"a, b"));
        assert!(lists_several(b"a,b"));
        assert!(lists_several(br#""a", "b""#));
        assert!(!lists_several(br#""a, b""#));
        assert!(
            !lists_several(br#""a\", b""#),
            "an escaped quote does not end the string"
        );
        assert!(!lists_several(b"8e03978e-40d5-43e8-bc93-6894a57f9324"));
    }

    #[test]
    fn hop_by_hop_headers_are_not_stored() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, x-private"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        h.append("set-cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2"));
        h.insert("trailer", HeaderValue::from_static("grpc-status"));
        let kept = end_to_end(&h);
        assert_eq!(kept.len(), 4);
        assert_eq!(
            kept["trailer"], "grpc-status",
            "end-to-end: it names the trailers"
        );
        assert!(kept.get("x-private").is_none());
        assert_eq!(kept.get_all("set-cookie").iter().count(), 2);
    }
}
