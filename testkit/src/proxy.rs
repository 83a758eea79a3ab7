//! A TCP proxy between a client and a server, that a test can cut: the network faults one
//! client sees while the server and every other client go on.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_testkit::proxy::Proxy;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! // An echo server stands in for etcd or Redis.
//! let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let upstream_addr = upstream.local_addr().unwrap();
//! tokio::spawn(async move {
//!     while let Ok((mut conn, _)) = upstream.accept().await {
//!         tokio::spawn(async move {
//!             let (mut r, mut w) = conn.split();
//!             let _ = tokio::io::copy(&mut r, &mut w).await;
//!         });
//!     }
//! });
//!
//! let proxy = Proxy::start(upstream_addr).await;
//! let mut conn = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
//! conn.write_all(b"ping").await.unwrap();
//! let mut buf = [0u8; 4];
//! conn.read_exact(&mut buf).await.unwrap();
//! assert_eq!(&buf, b"ping");
//!
//! proxy.cut(); // the connection is dropped
//! assert_eq!(conn.read(&mut buf).await.unwrap_or(0), 0);
//! proxy.restore(); // new connections pass again
//! # }
//! ```
//!
//! Three faults:
//! - [`cut`](Proxy::cut): every open connection is dropped at once, and new ones are accepted
//!   and dropped at once, until [`restore`](Proxy::restore) (a client sees its connection
//!   closed, then each reconnection closed: a server that went away).
//! - [`blackhole`](Proxy::blackhole): connections stay open but nothing passes either way,
//!   and new ones are accepted but never reach the server (a network partition: the client
//!   learns nothing until its own timeouts fire). [`restore`](Proxy::restore) lets what was
//!   held back through, late, as a healed partition does; [`cut`](Proxy::cut) drops it.
//! - [`freeze_after`](Proxy::freeze_after): the next request containing some bytes reaches
//!   the server, and then that connection passes nothing more (its answer is held back) until
//!   [`cut`](Proxy::cut) drops it: a reply lost with its connection. Other connections go on.
#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Open,
    Blackhole,
    Cut,
    /// The proxy is dropped: everything ends.
    Closed,
}

/// The mode, and which connections still live: a cut ends every connection of an earlier
/// epoch, even when [`Proxy::restore`] follows before a connection saw the cut.
#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    epoch: u64,
}

/// What every connection task shares.
#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    state: watch::Sender<State>,
    accepted: AtomicUsize,
    /// The bytes [`Proxy::freeze_after`] waits for (taken by the connection that sends them).
    freeze_needle: Mutex<Option<Vec<u8>>>,
    frozen: AtomicUsize,
    /// Bytes forwarded so far: clients → server, server → clients.
    forwarded: [AtomicU64; 2],
}

/// A TCP proxy on a free loopback port, forwarding to one upstream address; see the
/// [module docs](self). Dropping it ends every connection.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream` (connecting
    /// when the client connects).
    ///
    /// # Panics
    /// When no loopback port can be bound. Needs a tokio runtime.
    ///
    /// See the [module docs](self).
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| panic!("cannot bind a loopback port for a proxy: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("cannot read the proxy's port: {e}"));
        let (state, _) = watch::channel(State {
            mode: Mode::Open,
            epoch: 0,
        });
        let shared = Arc::new(Shared {
            upstream,
            state,
            accepted: AtomicUsize::new(0),
            freeze_needle: Mutex::new(None),
            frozen: AtomicUsize::new(0),
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Self {
            addr,
            shared,
            accept,
        }
    }

    /// A proxy in front of each of `upstreams`, in order (one client's way to every member of
    /// a cluster).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let upstreams = ["127.0.0.1:9".parse().unwrap(), "127.0.0.1:10".parse().unwrap()];
    /// let proxies = lock_testkit::proxy::Proxy::start_each(upstreams).await;
    /// assert_eq!(proxies[1].upstream(), upstreams[1]);
    /// # }
    /// ```
    pub async fn start_each(upstreams: impl IntoIterator<Item = SocketAddr>) -> Vec<Self> {
        let mut proxies = Vec::new();
        for upstream in upstreams {
            proxies.push(Self::start(upstream).await);
        }
        proxies
    }

    /// The address clients connect to (`127.0.0.1:<port>`).
    ///
    /// See the [module docs](self).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address it forwards to.
    ///
    /// See the [module docs](self).
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Drops every open connection and drops new ones at once, until
    /// [`restore`](Self::restore).
    ///
    /// See the [module docs](self).
    pub fn cut(&self) {
        self.shared.state.send_modify(|s| {
            s.mode = Mode::Cut;
            s.epoch += 1;
        });
    }

    /// Keeps connections open but lets nothing through, until [`restore`](Self::restore) (or a
    /// [`cut`](Self::cut)).
    ///
    /// See the [module docs](self).
    pub fn blackhole(&self) {
        self.shared.state.send_modify(|s| s.mode = Mode::Blackhole);
    }

    /// Lets traffic through again: new connections after a [`cut`](Self::cut), and what a
    /// [`blackhole`](Self::blackhole) held back. A connection frozen by
    /// [`freeze_after`](Self::freeze_after) stays frozen.
    ///
    /// See the [module docs](self).
    pub fn restore(&self) {
        self.shared.state.send_modify(|s| s.mode = Mode::Open);
    }

    /// Arms a freeze: the next time a client sends bytes containing `needle` (on any
    /// connection, once), they are forwarded, and then that connection passes nothing more
    /// either way; the server's answer is held back until a [`cut`](Self::cut) drops the
    /// connection. [`frozen`](Self::frozen) counts the connections frozen so far.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let proxy = lock_testkit::proxy::Proxy::start("127.0.0.1:9".parse().unwrap()).await;
    /// proxy.freeze_after(b"lock/order:42");
    /// assert_eq!(proxy.frozen(), 0);
    /// # }
    /// ```
    pub fn freeze_after(&self, needle: &[u8]) {
        *self
            .shared
            .freeze_needle
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(needle.to_vec());
    }

    /// How many connections [`freeze_after`](Self::freeze_after) has frozen.
    ///
    /// See [`freeze_after`](Self::freeze_after).
    pub fn frozen(&self) -> usize {
        self.shared.frozen.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until [`freeze_after`](Self::freeze_after) has frozen a connection.
    ///
    /// A reply lost with its connection, step by step: arm the freeze, start the request,
    /// wait here, check on the server that the request took effect (the held-back answer
    /// proves nothing yet), then [`cut`](Self::cut) and [`restore`](Self::restore): the
    /// client sees its connection drop without an answer and retries on a new one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use tokio::io::AsyncWriteExt;
    /// # let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    /// let proxy = lock_testkit::proxy::Proxy::start(upstream.local_addr().unwrap()).await;
    /// proxy.freeze_after(b"acquire");
    /// let mut client = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    /// client.write_all(b"acquire order:42").await.unwrap();
    /// proxy.wait_frozen().await;
    /// // ... the server has the request; its answer will never arrive:
    /// proxy.cut();
    /// proxy.restore();
    /// # }
    /// ```
    ///
    /// # Panics
    /// When no connection is frozen within 15 s.
    pub async fn wait_frozen(&self) {
        crate::eventually(
            "the proxy froze a connection",
            std::time::Duration::from_secs(15),
            async || self.frozen() > 0,
        )
        .await;
    }

    /// How many connections it has accepted (those dropped by a cut included): a client that
    /// reconnected shows here.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let proxy = lock_testkit::proxy::Proxy::start("127.0.0.1:9".parse().unwrap()).await;
    /// assert_eq!(proxy.accepted(), 0);
    /// # }
    /// ```
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// The bytes it has forwarded so far, over every connection: `(to the server, to the
    /// clients)`. What a client really sends over TCP (its protocol's framing included), e.g.
    /// to count a bench's traffic.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let proxy = lock_testkit::proxy::Proxy::start("127.0.0.1:9".parse().unwrap()).await;
    /// assert_eq!(proxy.forwarded(), (0, 0));
    /// # }
    /// ```
    pub fn forwarded(&self) -> (u64, u64) {
        let [up, down] = &self.shared.forwarded;
        (up.load(Ordering::SeqCst), down.load(Ordering::SeqCst))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.state.send_modify(|s| s.mode = Mode::Closed);
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut state = shared.state.subscribe();
    loop {
        let client = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
            () = until_closed(&mut state) => return,
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let now = *shared.state.borrow();
        match now.mode {
            Mode::Cut | Mode::Closed => drop(client),
            Mode::Open | Mode::Blackhole => {
                tokio::spawn(connection(client, shared.clone(), now.epoch));
            }
        }
    }
}

/// Whether a connection of `epoch` is over (cut since, or the proxy dropped).
fn ended(s: &State, epoch: u64) -> bool {
    s.epoch != epoch || s.mode == Mode::Closed
}

/// Waits until a connection of `epoch` is over.
async fn until_ended(state: &mut watch::Receiver<State>, epoch: u64) {
    let _ = state.wait_for(|s| ended(s, epoch)).await;
}

/// Waits until the proxy is dropped.
async fn until_closed(state: &mut watch::Receiver<State>) {
    let _ = state.wait_for(|s| s.mode == Mode::Closed).await;
}

/// Waits until traffic may pass (`true`), or the connection is over (`false`).
async fn may_pass(state: &mut watch::Receiver<State>, epoch: u64, frozen: &AtomicBool) -> bool {
    state
        .wait_for(|s| ended(s, epoch) || (s.mode == Mode::Open && !frozen.load(Ordering::SeqCst)))
        .await
        .is_ok_and(|s| !ended(&s, epoch))
}

async fn connection(client: TcpStream, shared: Arc<Shared>, epoch: u64) {
    let mut state = shared.state.subscribe();
    let never = AtomicBool::new(false);
    // A blackholed proxy does not even connect: the server never sees this client.
    if !may_pass(&mut state, epoch, &never).await {
        return;
    }
    let upstream = tokio::select! {
        connected = TcpStream::connect(shared.upstream) => match connected {
            Ok(upstream) => upstream,
            Err(_) => return,
        },
        () = until_ended(&mut state, epoch) => return,
    };
    let frozen = Arc::new(AtomicBool::new(false));
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = upstream.into_split();
    tokio::join!(
        pump(from_client, to_server, &shared, epoch, &frozen, true),
        pump(from_server, to_client, &shared, epoch, &frozen, false),
    );
}

/// Forwards one direction until EOF, an error, or the connection's end. `upstream`: this is
/// the client's side, where [`Proxy::freeze_after`] looks for its bytes.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    epoch: u64,
    frozen: &AtomicBool,
    upstream: bool,
) {
    let mut state = shared.state.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    // The end of the previous chunk, so that a needle split across two reads is found.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            () = until_ended(&mut state, epoch) => return,
        };
        let chunk = &buf[..n];
        if !may_pass(&mut state, epoch, frozen).await {
            return;
        }
        // Frozen before the request is written: its answer cannot slip through.
        if upstream && take_needle(shared, &tail, chunk) {
            frozen.store(true, Ordering::SeqCst);
            shared.frozen.fetch_add(1, Ordering::SeqCst);
        }
        // Counted before it is written: once the other side has it, it is counted.
        let direction = &shared.forwarded[usize::from(!upstream)];
        direction.fetch_add(n as u64, Ordering::SeqCst);
        tokio::select! {
            written = to.write_all(chunk) => if written.is_err() { return },
            () = until_ended(&mut state, epoch) => return,
        }
        if upstream {
            tail = [tail.as_slice(), chunk].concat();
            let keep = tail.len().saturating_sub(256);
            tail.drain(..keep);
        }
    }
}

/// Whether `tail + chunk` holds the armed needle (disarming it).
fn take_needle(shared: &Shared, tail: &[u8], chunk: &[u8]) -> bool {
    let mut needle = shared
        .freeze_needle
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let Some(wanted) = needle.as_deref() else {
        return false;
    };
    let seen = [tail, chunk].concat();
    let hit = !wanted.is_empty() && seen.windows(wanted.len()).any(|w| w == wanted);
    if hit {
        *needle = None;
    }
    hit
}
