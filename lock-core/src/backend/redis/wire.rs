//! The command connection of a one-server backend over plain TCP or a Unix socket: a
//! multiplexed connection of our own, in place of redis-rs's `ConnectionManager`.
//!
//! Counted with callgrind (BENCHMARKS.md, issue 34), redis-rs's multiplexed connection spent
//! more client instructions per lock cycle than all of lock-core: each command goes through a
//! channel to a driver task, a response timeout of the driver's own, and a combinator parser
//! (about 1,200 instructions per reply). Here a request appends its encoded bytes to the
//! connection's output buffer and its answer slot to the queue of pending requests (both under
//! one lock, so the queue is in the order the bytes go out), then wakes the connection's task,
//! which writes everything queued in one system call, reads, parses replies with a small
//! RESP2 parser, and hands each pending request its replies in order.
//!
//! What stays as before: every command and pipeline is still a redis-rs `Cmd` or `Pipeline`
//! packed by redis-rs, answers are redis-rs `Value`s (a server error is parsed by redis-rs
//! itself, so its kind is the same), each request waits at most the response timeout (a
//! timer of the caller's own, so a connection whose task is not run any more still answers
//! in time, and is then replaced), and a dropped connection fails every pending request with an I/O error, which
//! the backend retries once on a new connection (made by the next request, within the
//! connect timeout). TLS and RESP3 URLs keep redis-rs's `ConnectionManager`.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::sync::Mutex;

/// The most nested arrays a reply may have (the backend's deepest is two).
const MAX_DEPTH: usize = 32;
/// The longest bulk string a reply may have (Redis's own `proto-max-bulk-len` default).
const MAX_BULK: usize = 512 * 1024 * 1024;
/// The read buffer's size to start with; it grows for a reply that does not fit.
const READ_CHUNK: usize = 16 * 1024;
/// How many requests queue while others are in flight before they are sent without waiting
/// for the flusher (see [`Link::push`]).
const CHUNK: usize = 32;
/// The fewest answers the connection's task hands out before it lets their tasks run (see
/// [`read_replies`]).
const MIN_HAND_OUT: usize = 8;

/// Where the server is.
#[derive(Debug, Clone)]
enum Target {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

/// A multiplexed connection to one server; clones share it.
#[derive(Clone)]
pub(crate) struct Wire {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    /// `AUTH` and `SELECT` as the URL asks, sent first on every new connection.
    hello: Hello,
    db: i64,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// The connection in use (closed once it failed, until a request makes a new one).
    link: Mutex<Arc<Link>>,
    /// Connection attempts ended so far; with `connecting`, one attempt at a time, and the
    /// requests that waited for an attempt that failed get its error rather than making their
    /// own.
    attempts: AtomicU64,
    connecting: tokio::sync::Mutex<Option<(io::ErrorKind, String)>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Nobody can send on it any more: its task closes the socket and ends.
        self.link
            .get_mut()
            .close(io::ErrorKind::NotConnected, "the backend was dropped");
    }
}

/// What a new connection sends first: `AUTH` and `SELECT` as the URL asks.
struct Hello {
    /// Packed; empty when the URL asks for neither.
    packed: Vec<u8>,
    /// How many replies it gets.
    replies: usize,
    /// Whether it starts with `AUTH`.
    auth: bool,
    /// The same with `AUTH` of the password alone, when the URL names a user: a server
    /// before Redis 6 (no ACL users) refuses `AUTH user password`, and redis-rs tries again
    /// without the user, as this does.
    without_user: Option<Vec<u8>>,
}

impl Hello {
    fn new(settings: &redis::RedisConnectionInfo) -> Hello {
        let packed = |user: Option<&str>| {
            let mut out = Vec::new();
            if let Some(password) = settings.password() {
                let mut auth = redis::cmd("AUTH");
                if let Some(user) = user {
                    auth.arg(user);
                }
                auth.arg(password).write_packed_command(&mut out);
            }
            if settings.db() != 0 {
                redis::cmd("SELECT")
                    .arg(settings.db())
                    .write_packed_command(&mut out);
            }
            out
        };
        let auth = settings.password().is_some();
        Hello {
            packed: packed(settings.username()),
            replies: usize::from(auth) + usize::from(settings.db() != 0),
            auth,
            without_user: (auth && settings.username().is_some()).then(|| packed(None)),
        }
    }

    /// Why the server refused the connection, from its replies to `hello`; `Ok(true)` when it
    /// refused only the user name of `AUTH` (a server before Redis 6).
    fn refusal(&self, replies: Vec<Value>) -> Result<bool, RedisError> {
        let mut replies = replies.into_iter();
        if self.auth
            && let Some(Value::ServerError(e)) = replies.next()
        {
            let why = e.details().unwrap_or(e.code()).to_owned();
            if self.without_user.is_some()
                && why.contains("wrong number of arguments for 'auth' command")
            {
                return Ok(true);
            }
            // The kind redis-rs gives a refused AUTH, with the server's reason.
            return Err(RedisError::from((
                ErrorKind::AuthenticationFailed,
                "Password authentication failed",
                format!("{}: {why}", e.code()),
            )));
        }
        match replies.find_map(|r| r.extract_error().err()) {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }
}

/// One connection: what its task has to write and who waits for replies.
struct Link {
    state: Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    /// Encoded requests not handed to the connection's task yet.
    out: Vec<u8>,
    /// Requests sent or queued, in the order of their bytes.
    pending: VecDeque<Pending>,
    /// The connection's task, parked until there is something to write.
    task: Option<Waker>,
    /// Requests queued in `out` since the task last took it.
    unsent: usize,
    /// Whether a request queued in `out` will wake the task once the tasks that can run now
    /// have run (and queued theirs): see [`Link::push`].
    flusher: bool,
    /// Why the connection ended (no request is queued on it any more).
    closed: Option<(io::ErrorKind, String)>,
    /// How many times the connection's task was polled: a request that timed out with no
    /// poll since it was queued finds the task not run any more.
    polls: u64,
}

/// A request queued on a connection, as its caller waits for it.
struct Queued {
    link: Arc<Link>,
    /// The task's polls when the request was queued.
    polls: u64,
    answer: oneshot::Receiver<Result<Value, RedisError>>,
    /// Whether this request is to wake the connection's task after a yield (`push`).
    flush: bool,
}

impl Drop for Queued {
    fn drop(&mut self) {
        // A caller that gives up before its flush still sends what it queued (and what others
        // queued counting on it).
        if self.flush {
            self.link.flush();
        }
    }
}

/// A request waiting for its replies.
struct Pending {
    /// Replies to drop before the ones this request wants.
    skip: usize,
    /// `None`: one command, answered by one reply; `Some(n)`: a pipeline, answered by `n`.
    wants: Option<usize>,
    got: Vec<Value>,
    answer: oneshot::Sender<Result<Value, RedisError>>,
}

impl Link {
    /// Queues a request (`encode` appends its bytes), or `None` when the connection has ended.
    ///
    /// When to send it: at once (the task is woken) when nothing else is in flight, as a
    /// lone request waits for nobody, or when `CHUNK` requests are queued; otherwise the first
    /// request queued since the task last wrote is the flusher (`Queued::flush`): its caller
    /// yields, so that the other tasks that can run now queue theirs, then wakes the task,
    /// which writes them all in one system call. Waking the task at every request instead
    /// would send one request per write on a multi-thread runtime, where a task woken by
    /// another runs next.
    fn push(
        self: &Arc<Link>,
        encode: &impl Fn(&mut Vec<u8>),
        skip: usize,
        wants: Option<usize>,
    ) -> Option<Queued> {
        let mut state = self.state.lock();
        if state.closed.is_some() {
            return None;
        }
        let (answer, receiver) = oneshot::channel();
        let idle = state.pending.is_empty();
        encode(&mut state.out);
        state.pending.push_back(Pending {
            skip,
            wants,
            got: Vec::new(),
            answer,
        });
        state.unsent += 1;
        let mut flush = false;
        if idle || state.unsent >= CHUNK {
            if let Some(task) = state.task.take() {
                task.wake();
            }
        } else if !state.flusher {
            state.flusher = true;
            flush = true;
        }
        Some(Queued {
            link: Arc::clone(self),
            polls: state.polls,
            answer: receiver,
            flush,
        })
    }

    /// Wakes the task when requests wait in `out` (the flusher's part, see `push`).
    fn flush(&self) {
        let task = {
            let mut state = self.state.lock();
            if state.out.is_empty() {
                None
            } else {
                state.task.take()
            }
        };
        if let Some(task) = task {
            task.wake();
        }
    }

    /// Ends the connection when its task has not been polled since a request was queued
    /// `polls` ago, a whole response timeout: its runtime is gone or not driven any more (a
    /// backend used from another runtime than the one it connected in), and nothing queued
    /// on it would ever be sent. The requests pending get an error the backend retries, on a
    /// new connection made in the caller's runtime.
    ///
    /// Not polled because it was not asked to (its waker is still there, not taken by a wake:
    /// the request waited behind a flusher whose caller keeps its future without polling it,
    /// on a server slower than the timeout) is not a task that is not run: it is asked now,
    /// and the connection stays (the next timeout, if it is not run, ends it).
    fn close_if_stalled(&self, polls: u64) {
        let task = {
            let mut state = self.state.lock();
            if state.polls != polls {
                return;
            }
            state.task.take()
        };
        match task {
            Some(task) => task.wake(),
            None => self.close(
                io::ErrorKind::ConnectionAborted,
                "the Redis connection's task was not run for a whole response timeout",
            ),
        }
    }

    fn closed(why: (io::ErrorKind, String)) -> Arc<Link> {
        Arc::new(Link {
            state: Mutex::new(LinkState {
                closed: Some(why),
                ..LinkState::default()
            }),
        })
    }

    /// Ends the connection: every pending request gets an I/O error of `kind` (the backend
    /// retries those once on a new connection: each of its calls is safe to send twice), its
    /// task is woken to end.
    fn close(&self, kind: io::ErrorKind, why: &str) {
        let (pending, task) = {
            let mut state = self.state.lock();
            if state.closed.is_none() {
                state.closed = Some((kind, why.to_owned()));
            }
            state.out = Vec::new();
            (std::mem::take(&mut state.pending), state.task.take())
        };
        for p in pending {
            let _ = p
                .answer
                .send(Err(io::Error::new(kind, why.to_owned()).into()));
        }
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Wire {
    /// A connection to the server `info` names (plain TCP or a Unix socket, RESP2), or `None`
    /// for one this connection does not speak (TLS, RESP3): those keep redis-rs's.
    pub(crate) fn for_info(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Option<Wire> {
        let target = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Target::Tcp(host.clone(), *port),
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Target::Unix(path.clone()),
            _ => return None,
        };
        let settings = info.redis_settings();
        if settings.protocol() != redis::ProtocolVersion::RESP2 {
            return None;
        }
        let never = (io::ErrorKind::NotConnected, "not connected yet".to_owned());
        Some(Wire {
            shared: Arc::new(Shared {
                target,
                hello: Hello::new(settings),
                db: settings.db(),
                connect_timeout,
                response_timeout,
                link: Mutex::new(Link::closed(never)),
                attempts: AtomicU64::new(0),
                connecting: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// Connects now (the backend's `connect` reports a server it cannot reach at once).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        self.reconnect().await
    }

    /// The database the connection selected.
    pub(crate) fn db(&self) -> i64 {
        self.shared.db
    }

    /// Sends one command; its reply (a server error as `Value::ServerError`, as redis-rs's
    /// multiplexed connection answers).
    pub(crate) async fn command(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let answer = self
            .send(|out| cmd.write_packed_command(out), 0, None)
            .await?;
        self.wait(answer).await
    }

    /// Sends a pipeline; `count` replies after the first `offset`, as redis-rs's
    /// `req_packed_commands` answers (transactions are not sent here: the backend sends none).
    /// The replies after those are read and dropped: whatever `offset` and `count` say, the
    /// request takes one reply per command of the pipeline, no fewer and no more.
    pub(crate) async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        if pipeline.is_transaction() {
            return Err(RedisError::from((
                ErrorKind::Client,
                "transactions are not sent on this connection",
            )));
        }
        if count == 0 {
            return Err(RedisError::from((
                ErrorKind::Client,
                "a pipeline that wants no reply is not sent on this connection",
            )));
        }
        let replies = pipeline.len();
        if offset
            .checked_add(count)
            .is_none_or(|wanted| wanted > replies)
        {
            return Err(RedisError::from((
                ErrorKind::Client,
                "a pipeline asked for more replies than its commands get",
                format!("replies {offset}..+{count} of {replies}"),
            )));
        }
        // Packed straight into the connection's buffer (not a transaction: its commands one
        // after the other), not into a buffer of its own first.
        let encode = |out: &mut Vec<u8>| {
            for cmd in pipeline.cmd_iter() {
                cmd.write_packed_command(out);
            }
        };
        let answer = self.send(encode, offset, Some(replies - offset)).await?;
        match self.wait(answer).await? {
            Value::Array(mut values) => {
                values.truncate(count);
                Ok(values)
            }
            other => Ok(vec![other]),
        }
    }

    /// Queues a request (`encode` appends its bytes), making a connection first when the last
    /// one ended.
    async fn send(
        &self,
        encode: impl Fn(&mut Vec<u8>),
        skip: usize,
        wants: Option<usize>,
    ) -> Result<Queued, RedisError> {
        if let Some(answer) = self.queue(&encode, skip, wants) {
            return Ok(answer);
        }
        self.reconnect().await?;
        self.queue(&encode, skip, wants).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection ended as it was made",
            )
            .into()
        })
    }

    /// Queues a request on the current connection, or `None` when it has ended.
    fn queue(
        &self,
        encode: &impl Fn(&mut Vec<u8>),
        skip: usize,
        wants: Option<usize>,
    ) -> Option<Queued> {
        self.shared.link.lock().push(encode, skip, wants)
    }

    /// The answer to a queued request, within the response timeout.
    async fn wait(&self, mut queued: Queued) -> Result<Value, RedisError> {
        if queued.flush {
            // Queued behind the tasks that can run now (they run and queue theirs first). Not
            // `tokio::task::yield_now`, which defers the task until the runtime next polls
            // its I/O driver: a system call (`epoll_wait`) more per flush when that poll
            // would not have happened anyway, and on a multi-thread runtime a wait until the
            // worker runs out of work or has polled 61 tasks.
            let mut yielded = false;
            poll_fn(|cx| {
                if yielded {
                    return Poll::Ready(());
                }
                yielded = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            })
            .await;
            queued.flush = false;
            queued.link.flush();
        }
        match tokio::time::timeout(self.shared.response_timeout, &mut queued.answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection's task ended",
            )
            .into()),
            Err(_) => {
                queued.link.close_if_stalled(queued.polls);
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer from Redis within the response timeout",
                )
                .into())
            }
        }
    }

    /// Makes a new connection unless another request made one (or failed to) meanwhile.
    async fn reconnect(&self) -> Result<(), RedisError> {
        let shared = &self.shared;
        // Attempts ended so far: one that ends while this request waits for the lock is as
        // recent as its own would be, and its error is shared rather than tried again.
        let seen = shared.attempts.load(Ordering::Acquire);
        // An attempt ends within the connect timeout, unless the request making it is not
        // polled any more (its caller kept its future and waits on something else): then
        // this one fails in that time too, rather than waiting for good.
        let waited = tokio::time::timeout(shared.connect_timeout, shared.connecting.lock()).await;
        let Ok(mut last_failure) = waited else {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "another connection attempt did not end within the connect timeout",
            )
            .into());
        };
        if shared.link.lock().state.lock().closed.is_none() {
            return Ok(());
        }
        if shared.attempts.load(Ordering::Acquire) != seen
            && let Some((kind, why)) = last_failure.as_ref()
        {
            return Err(io::Error::new(*kind, why.clone()).into());
        }
        let made = match tokio::time::timeout(shared.connect_timeout, self.open()).await {
            Ok(Ok(link)) => {
                *last_failure = None;
                *shared.link.lock() = link;
                Ok(())
            }
            Ok(Err(e)) => {
                let kind = io_kind(&e);
                *last_failure = Some((kind, e.to_string()));
                Err(e)
            }
            Err(_) => {
                let why = format!(
                    "no connection to Redis within the connect timeout ({:?})",
                    shared.connect_timeout
                );
                *last_failure = Some((io::ErrorKind::TimedOut, why.clone()));
                Err(io::Error::new(io::ErrorKind::TimedOut, why).into())
            }
        };
        shared.attempts.fetch_add(1, Ordering::AcqRel);
        made
    }

    /// A new connection, its task started and `hello` answered.
    async fn open(&self) -> Result<Arc<Link>, RedisError> {
        let link = Arc::new(Link {
            state: Mutex::new(LinkState::default()),
        });
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            RedisError::from((
                ErrorKind::Client,
                "a Redis connection needs a tokio runtime",
            ))
        })?;
        match &self.shared.target {
            Target::Tcp(host, port) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                runtime.spawn(drive(Closer(Arc::clone(&link)), stream));
            }
            #[cfg(unix)]
            Target::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await?;
                runtime.spawn(drive(Closer(Arc::clone(&link)), stream));
            }
        }
        // Until it is returned, the connection is this attempt's alone: ended if the attempt
        // is given up half way (the connect timeout, the caller's own deadline) or fails.
        let mut attempt = Attempt(Some(Arc::clone(&link)));
        let hello = &self.shared.hello;
        if hello.replies > 0 {
            // The URL's `AUTH`, then (refused by a server before Redis 6) the password alone.
            let mut tries = std::iter::once(&hello.packed).chain(&hello.without_user);
            loop {
                let Some(packed) = tries.next() else {
                    return Err(RedisError::from((
                        ErrorKind::AuthenticationFailed,
                        "Password authentication failed",
                        "AUTH refused with and without the user name".to_owned(),
                    )));
                };
                let send = |out: &mut Vec<u8>| out.extend_from_slice(packed);
                let replies = match link.push(&send, 0, Some(hello.replies)) {
                    Some(queued) => self.wait(queued).await,
                    None => Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the connection ended as it was made",
                    )
                    .into()),
                };
                let refused = match replies {
                    Ok(Value::Array(replies)) => hello.refusal(replies),
                    Ok(other) => Err(RedisError::from((
                        ErrorKind::Parse,
                        "unexpected answer to AUTH / SELECT",
                        format!("{other:?}"),
                    ))),
                    Err(e) => Err(e),
                };
                match refused {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(e) => {
                        link.close(io::ErrorKind::NotConnected, "AUTH or SELECT refused");
                        return Err(e);
                    }
                }
            }
        }
        attempt.0 = None;
        Ok(link)
    }
}

/// A connection being made: ended when dropped before it is kept (its task and socket would
/// otherwise live on with nobody to use or close them).
struct Attempt(Option<Arc<Link>>);

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(link) = self.0.take() {
            link.close(
                io::ErrorKind::ConnectionAborted,
                "the connection attempt was given up",
            );
        }
    }
}

/// The I/O error kind of `e`, or `Other`.
fn io_kind(e: &RedisError) -> io::ErrorKind {
    if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_connection_refusal() {
        io::ErrorKind::ConnectionRefused
    } else if e.is_io_error() {
        io::ErrorKind::ConnectionAborted
    } else {
        io::ErrorKind::Other
    }
}

/// Ends the link when the connection's task ends, or is dropped with its runtime: made before
/// the task is spawned, so that a task dropped before it ever ran ends it too (an async fn's
/// body, and what it makes, starts only at the first poll).
struct Closer(Arc<Link>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.close(
            io::ErrorKind::ConnectionAborted,
            "the Redis connection's task ended",
        );
    }
}

/// The connection's task: writes what requests queue, reads replies and hands them out, until
/// the connection fails or the backend is dropped.
async fn drive<S: AsyncRead + AsyncWrite + Unpin>(closer: Closer, mut stream: S) {
    let link = &closer.0;
    let mut writing: Vec<u8> = Vec::new();
    let mut written = 0;
    let mut read = vec![0; READ_CHUNK];
    let (mut start, mut end) = (0, 0);
    let mut scratch = Scratch::default();
    let ended: (io::ErrorKind, String) = poll_fn(|cx| {
        loop {
            if written == writing.len() {
                writing.clear();
                written = 0;
                let mut state = link.state.lock();
                if let Some(why) = &state.closed {
                    return Poll::Ready(why.clone());
                }
                std::mem::swap(&mut state.out, &mut writing);
                state.unsent = 0;
                state.flusher = false;
            }
            while written < writing.len() {
                match Pin::new(&mut stream).poll_write(cx, &writing[written..]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready((
                            io::ErrorKind::WriteZero,
                            "Redis took no bytes".into(),
                        ));
                    }
                    Poll::Ready(Ok(n)) => written += n,
                    Poll::Ready(Err(e)) => return Poll::Ready((e.kind(), e.to_string())),
                    Poll::Pending => break,
                }
            }
            if writing.capacity() > 1 << 20 && written == writing.len() {
                writing = Vec::new();
                written = 0;
            }
            let more = match read_replies(
                link,
                &mut stream,
                cx,
                &mut read,
                (&mut start, &mut end),
                &mut scratch,
            ) {
                Ok(more) => more,
                Err(why) => return Poll::Ready(why),
            };
            let mut state = link.state.lock();
            state.polls = state.polls.wrapping_add(1);
            if let Some(why) = &state.closed {
                return Poll::Ready(why.clone());
            }
            if more {
                // A chunk was handed out and more answers wait: their tasks run first (and
                // queue their next requests, which go out before the next chunk). No waker is
                // left: a wake is on its way (`close_if_stalled` tells a task asked to run by
                // one that was not).
                state.task = None;
                drop(state);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if !state.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                state.task = Some(cx.waker().clone());
            }
            if written == writing.len() && !state.out.is_empty() {
                continue;
            }
            return Poll::Pending;
        }
    })
    .await;
    closer.0.close(ended.0, &ended.1);
}

/// Hands out the whole replies read before, then reads what the socket has and hands those
/// out, to half of the requests in flight at most: `Ok(true)` when it stopped at that bound
/// (more may wait in `read`), `Ok(false)` when the socket has nothing more now, `Err` when the
/// connection ended or sent what is not RESP.
fn read_replies<S: AsyncRead + Unpin>(
    link: &Link,
    stream: &mut S,
    cx: &mut Context<'_>,
    read: &mut Vec<u8>,
    (start, end): (&mut usize, &mut usize),
    scratch: &mut Scratch,
) -> Result<bool, (io::ErrorKind, String)> {
    // Half of what is in flight: the tasks answered first run and queue their next requests,
    // which go out (and keep the server busy) while the second half is handed out and run.
    // Handed out all at once, the answers of every task would be run before any request went
    // out, the server idle meanwhile, then the client idle while the server works through
    // them all: measured pinned (client and server on a core each) at 64 tasks, that ran the
    // two one after the other (0.97 of one core's worth of work at a time), halves ran them
    // side by side (1.6 to 1.8).
    //
    // Counted in requests, not replies: a pipeline's replies all go to one request, and a
    // pipeline of 512 commands alone on the connection took 64 polls of the task (64 trips
    // through the run queue) before its one answer.
    let mut budget = {
        let state = link.state.lock();
        let limit = (state.pending.len() / 2).max(MIN_HAND_OUT);
        if state.pending.len() <= limit {
            usize::MAX
        } else {
            // The replies the first `limit` requests still take.
            state
                .pending
                .iter()
                .take(limit)
                .map(|p| p.skip + p.wants.unwrap_or(1) - p.got.len())
                .sum()
        }
    };
    loop {
        if hand_out(link, read, start, *end, scratch, &mut budget)? {
            return Ok(true);
        }
        if *start == *end {
            (*start, *end) = (0, 0);
            if read.len() > READ_CHUNK * 64 {
                *read = vec![0; READ_CHUNK];
            }
        }
        if *end == read.len() {
            if *start > 0 {
                read.copy_within(*start..*end, 0);
                *end -= *start;
                *start = 0;
            } else {
                // One reply larger than the buffer.
                let more = read.len();
                read.resize(read.len() + more, 0);
            }
        }
        let mut buf = ReadBuf::new(&mut read[*end..]);
        match Pin::new(&mut *stream).poll_read(cx, &mut buf) {
            Poll::Pending => return Ok(false),
            Poll::Ready(Err(e)) => return Err((e.kind(), e.to_string())),
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len();
                if n == 0 {
                    return Err((
                        io::ErrorKind::UnexpectedEof,
                        "Redis closed the connection".into(),
                    ));
                }
                *end += n;
            }
        }
    }
}

/// Parses the whole replies in `read[*start..end]`, `budget` of them at most (`Ok(true)` when
/// it stopped there with bytes left), and gives each pending request its replies, in order.
/// The lock is held only to take the requests answered off the queue: the answers are sent
/// (and their tasks woken) after it is let go, so that a woken task on another thread does
/// not find it taken.
fn hand_out(
    link: &Link,
    read: &[u8],
    start: &mut usize,
    end: usize,
    scratch: &mut Scratch,
    budget: &mut usize,
) -> Result<bool, (io::ErrorKind, String)> {
    let Scratch { replies, answered } = scratch;
    // The replies before a fault still go to their requests (they were answered): only then
    // does the connection end.
    let mut fault = None;
    let mut limited = false;
    loop {
        if *budget == 0 {
            limited = *start < end;
            break;
        }
        match parse(&read[*start..end], 0) {
            Ok(Some((reply, used))) => {
                *start += used;
                *budget -= 1;
                replies.push(reply);
            }
            Ok(None) => break,
            Err(e) => {
                fault = Some((io::ErrorKind::InvalidData, e));
                break;
            }
        }
    }
    if !replies.is_empty() {
        let mut state = link.state.lock();
        for reply in replies.drain(..) {
            let Some(front) = state.pending.front_mut() else {
                fault = Some((
                    io::ErrorKind::InvalidData,
                    "Redis sent a reply nobody asked for".into(),
                ));
                break;
            };
            if front.skip > 0 {
                front.skip -= 1;
                continue;
            }
            let reply = match front.wants {
                None => reply,
                Some(n) => {
                    front.got.push(reply);
                    if front.got.len() < n {
                        continue;
                    }
                    Value::Array(std::mem::take(&mut front.got))
                }
            };
            if let Some(done) = state.pending.pop_front() {
                answered.push((done.answer, reply));
            }
        }
    }
    for (answer, reply) in answered.drain(..) {
        let _ = answer.send(Ok(reply));
    }
    fault.map_or(Ok(limited), Err)
}

/// Buffers the connection's task reuses from one read to the next.
#[derive(Default)]
struct Scratch {
    replies: Vec<Value>,
    answered: Vec<(oneshot::Sender<Result<Value, RedisError>>, Value)>,
}

/// One RESP2 reply at the start of `buf` and the bytes it takes, `None` while it is not all
/// there, `Err` for what is not RESP2.
fn parse(buf: &[u8], depth: usize) -> Result<Option<(Value, usize)>, String> {
    let Some((line, after)) = line(buf)? else {
        return Ok(None);
    };
    let (kind, rest) = (line[0], &line[1..]);
    Ok(Some(match kind {
        b'+' => {
            let value = if rest == b"OK" {
                Value::Okay
            } else {
                Value::SimpleString(String::from_utf8_lossy(rest).into_owned())
            };
            (value, after)
        }
        b'-' => {
            // redis-rs reads the error: the same `ServerError` and kind as its own connection.
            let value = redis::parse_redis_value(&buf[..after])
                .map_err(|e| format!("an error reply redis-rs cannot read: {e}"))?;
            (value, after)
        }
        b':' => (Value::Int(integer(rest)?), after),
        b'$' => {
            let n = integer(rest)?;
            if n < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            let n = usize::try_from(n).map_err(|e| e.to_string())?;
            if n > MAX_BULK {
                return Err(format!("a bulk string of {n} bytes"));
            }
            let Some(data) = buf.get(after..after + n + 2) else {
                return Ok(None);
            };
            if &data[n..] != b"\r\n" {
                return Err("a bulk string not ended by CRLF".into());
            }
            (Value::BulkString(data[..n].to_vec()), after + n + 2)
        }
        b'*' => {
            let n = integer(rest)?;
            if n < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            if depth >= MAX_DEPTH {
                return Err(format!("arrays nested more than {MAX_DEPTH} deep"));
            }
            let n = usize::try_from(n).map_err(|e| e.to_string())?;
            let mut items = Vec::with_capacity(n.min(1024));
            let mut at = after;
            for _ in 0..n {
                let Some((item, used)) = parse(&buf[at..], depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at += used;
            }
            (Value::Array(items), at)
        }
        other => {
            return Err(format!(
                "a reply of type {:?}: not RESP2",
                char::from(other).escape_default().to_string()
            ));
        }
    }))
}

/// The first line of `buf` (without its CRLF, at least one byte) and where the next begins.
fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, String> {
    let Some(cr) = buf.iter().position(|&b| b == b'\r') else {
        if buf.len() > 64 * 1024 {
            return Err("a reply line longer than 64 KiB".into());
        }
        return Ok(None);
    };
    match buf.get(cr + 1) {
        None => Ok(None),
        Some(b'\n') if cr > 0 => Ok(Some((&buf[..cr], cr + 2))),
        Some(_) => Err("a reply line not ended by CRLF".into()),
    }
}

/// A RESP integer.
fn integer(digits: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "{:?} is not an integer",
                String::from_utf8_lossy(digits).escape_default().to_string()
            )
        })
}

#[cfg(test)]
mod live;

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        let (value, used) = parse(bytes, 0).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        value
    }

    /// Each RESP2 type, and every prefix of a reply is "not there yet", never a wrong value.
    #[test]
    fn replies_parse_as_redis_rs_parses_them() {
        let cases: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b"-ERR wrong\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b":42\r\n",
            b":-7\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nab\r\nc\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n$-1\r\n:0\r\n",
        ];
        for case in cases {
            let ours = whole(case);
            let theirs = redis::parse_redis_value(case).unwrap();
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{case:?}");
            for cut in 0..case.len() {
                assert!(
                    parse(&case[..cut], 0).unwrap().is_none(),
                    "{case:?} cut at {cut}"
                );
            }
        }
    }

    /// What is not RESP2 is an error, not a value or a wait.
    #[test]
    fn garbage_is_an_error() {
        for bad in [
            &b"HTTP/1.1 400\r\n"[..],
            b":x\r\n",
            b"$3\r\nabcd\r\n",
            b"\r\n",
            b":1\rx",
            b"$99999999999\r\n",
            b"%1\r\n",
        ] {
            assert!(parse(bad, 0).is_err(), "{bad:?}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1);
        assert!(parse(deep.as_bytes(), 0).is_err());
    }
}
