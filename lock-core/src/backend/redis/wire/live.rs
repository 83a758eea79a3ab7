//! wire.rs against a real redis-server: every reply reaches the request that asked for it (or
//! that request gets an error, never another's reply); a connection that ends, stalls or is
//! given up ends its task and its socket.

use super::*;

use lock_testkit::RedisServer;
use lock_testkit::proxy::Proxy;
use redis::IntoConnectionInfo;
use tokio::task::JoinSet;

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(5);

fn wire(url: &str, connect: Duration, response: Duration) -> Wire {
    let info = url.into_connection_info().unwrap();
    Wire::for_info(&info, connect, response).unwrap()
}

fn echo(payload: &str) -> Cmd {
    let mut cmd = redis::cmd("ECHO");
    cmd.arg(payload);
    cmd
}

fn is_closed(wire: &Wire) -> bool {
    wire.shared.link.lock().state.lock().closed.is_some()
}

/// `connected_clients` of the server (the connection asking included).
async fn clients(server: &RedisServer) -> usize {
    let info = server.info("clients").await;
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// A small generator of test choices (no seed to keep: any sequence must pass).
struct Dice(u64);

impl Dice {
    fn new() -> Dice {
        Dice(rand::random::<u64>() | 1)
    }

    fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides
    }
}

/// A paused server: each request times out within the response timeout; after it resumes, the
/// late replies go to the requests that timed out, never to newer ones.
#[tokio::test]
async fn late_replies_after_a_pause_never_reach_newer_requests() {
    let mut server = RedisServer::start();
    let wire = wire(&server.url(), LONG, SHORT);
    wire.connect().await.unwrap();
    server.pause();
    let mut requests = JoinSet::new();
    for i in 0..20 {
        let wire = wire.clone();
        requests.spawn(async move {
            let started = std::time::Instant::now();
            let answer = wire.command(&echo(&format!("stale {i}"))).await;
            (answer, started.elapsed())
        });
    }
    while let Some(joined) = requests.join_next().await {
        let (answer, took) = joined.unwrap();
        assert!(answer.unwrap_err().is_timeout());
        assert!(took < SHORT * 3, "{took:?}");
    }
    // The connection's task ran: a slow server is no reason to replace it.
    assert!(!is_closed(&wire));
    server.resume();
    for i in 0..20 {
        let payload = format!("fresh {i}");
        let answer = wire.command(&echo(&payload)).await.unwrap();
        assert_eq!(answer, Value::BulkString(payload.into_bytes()));
    }
}

/// A stream that reads at most one byte at a time: every reply arrives split at every byte.
struct OneByte<S>(S);

impl<S: AsyncRead + Unpin> AsyncRead for OneByte<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let mut one = [0u8; 1];
        let mut small = ReadBuf::new(&mut one);
        match Pin::new(&mut self.0).poll_read(cx, &mut small) {
            Poll::Ready(Ok(())) => {
                buf.put_slice(small.filled());
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for OneByte<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Replies of every shape (nested arrays, errors, nils, pipelines) read one byte at a time
/// from a real server each reach the request that asked.
#[tokio::test]
async fn replies_split_at_every_byte_reach_their_requests() {
    let server = RedisServer::start();
    let wire = wire(&server.url(), LONG, LONG);
    let link = Arc::new(Link {
        state: Mutex::new(LinkState::default()),
    });
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .unwrap();
    let task = tokio::spawn(drive(Closer(Arc::clone(&link)), OneByte(stream)));
    *wire.shared.link.lock() = Arc::clone(&link);
    let mut setup = redis::pipe();
    setup
        .cmd("RPUSH")
        .arg("list")
        .arg("a")
        .arg("")
        .arg("c\r\n")
        .cmd("SET")
        .arg("s")
        .arg("v");
    let replies = wire.pipeline(&setup, 0, 2).await.unwrap();
    assert_eq!(replies, vec![Value::Int(3), Value::Okay]);
    let mut mixed = redis::pipe();
    mixed
        .cmd("LRANGE")
        .arg("list")
        .arg(0)
        .arg(-1)
        .cmd("GET")
        .arg("missing")
        .cmd("INCR")
        .arg("s")
        .cmd("EVAL")
        .arg("return {1, {'x', {2}}, redis.status_reply('FINE')}")
        .arg(0);
    let mut requests = JoinSet::new();
    for i in 0..10 {
        let (wire, mixed) = (wire.clone(), mixed.clone());
        requests.spawn(async move {
            let payload = format!("echo {i}");
            let cmd = echo(&payload);
            let (one, many) = tokio::join!(wire.command(&cmd), wire.pipeline(&mixed, 0, 4));
            assert_eq!(one.unwrap(), Value::BulkString(payload.into_bytes()));
            let many = many.unwrap();
            assert_eq!(
                many[0],
                Value::Array(vec![
                    Value::BulkString(b"a".to_vec()),
                    Value::BulkString(Vec::new()),
                    Value::BulkString(b"c\r\n".to_vec())
                ])
            );
            assert_eq!(many[1], Value::Nil);
            assert!(matches!(many[2], Value::ServerError(_)), "{:?}", many[2]);
            assert_eq!(
                many[3],
                Value::Array(vec![
                    Value::Int(1),
                    Value::Array(vec![
                        Value::BulkString(b"x".to_vec()),
                        Value::Array(vec![Value::Int(2)])
                    ]),
                    Value::SimpleString("FINE".into())
                ])
            );
        });
    }
    while let Some(done) = requests.join_next().await {
        done.unwrap();
    }
    drop(wire);
    // The wire dropped: the task ends.
    tokio::time::timeout(LONG, task).await.unwrap().unwrap();
}

/// Large replies (a bulk string of many megabytes, an array of many keys) arrive whole, in
/// many reads, each to its request, alongside small ones.
#[tokio::test]
async fn large_replies_reach_their_requests() {
    let server = RedisServer::start();
    let wire = wire(&server.url(), LONG, LONG);
    wire.connect().await.unwrap();
    let big = 24 << 20;
    server.fill("big", big).await;
    let mut keys = redis::pipe();
    for i in 0..20_000 {
        keys.cmd("SET").arg(format!("k{i}")).arg(i).ignore();
    }
    keys.cmd("DBSIZE");
    let replies = wire.pipeline(&keys, 0, 20_001).await.unwrap();
    assert_eq!(replies.last(), Some(&Value::Int(20_001)));
    let (get, between, keys, after) = (
        redis::cmd("GET").arg("big").clone(),
        echo("between"),
        redis::cmd("KEYS").arg("k*").clone(),
        echo("after"),
    );
    let (a, b, c, d) = tokio::join!(
        wire.command(&get),
        wire.command(&between),
        wire.command(&keys),
        wire.command(&after),
    );
    match a.unwrap() {
        Value::BulkString(v) => assert_eq!(v.len(), big),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.unwrap(), Value::BulkString(b"between".to_vec()));
    match c.unwrap() {
        Value::Array(v) => assert_eq!(v.len(), 20_000),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.unwrap(), Value::BulkString(b"after".to_vec()));
}

/// Many tasks on a multi-thread runtime, commands and pipelines of echoes (small and large),
/// some given up before their answer, while the server kills the connection now and then:
/// every answer a request gets is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_kills_and_given_up_requests_every_answer_is_its_own() {
    let server = RedisServer::start();
    let wire = wire(&server.url(), LONG, LONG);
    wire.connect().await.unwrap();
    let mut tasks = JoinSet::new();
    for t in 0..16 {
        let wire = wire.clone();
        tasks.spawn(async move {
            let mut dice = Dice::new();
            let (mut ok, mut failed) = (0, 0);
            for j in 0..300 {
                let pad = if dice.roll(40) == 0 { 100_000 } else { 0 };
                let payload = |k: u64| format!("{t}/{j}/{k}/{}", "x".repeat(pad));
                match dice.roll(3) {
                    0 => {
                        let p = payload(0);
                        match wire.command(&echo(&p)).await {
                            Ok(v) => {
                                assert_eq!(v, Value::BulkString(p.into_bytes()));
                                ok += 1;
                            }
                            Err(_) => failed += 1,
                        }
                    }
                    1 => {
                        let n = 1 + dice.roll(5);
                        let mut pipe = redis::pipe();
                        for k in 0..n {
                            pipe.cmd("ECHO").arg(payload(k));
                        }
                        match wire.pipeline(&pipe, 0, n as usize).await {
                            Ok(v) => {
                                let want: Vec<Value> = (0..n)
                                    .map(|k| Value::BulkString(payload(k).into_bytes()))
                                    .collect();
                                assert_eq!(v, want);
                                ok += 1;
                            }
                            Err(_) => failed += 1,
                        }
                    }
                    _ => {
                        let p = payload(0);
                        let within = Duration::from_micros(dice.roll(300));
                        match tokio::time::timeout(within, wire.command(&echo(&p))).await {
                            Ok(Ok(v)) => {
                                assert_eq!(v, Value::BulkString(p.into_bytes()));
                                ok += 1;
                            }
                            _ => failed += 1,
                        }
                    }
                }
            }
            (ok, failed)
        });
    }
    let admin = {
        let mut conn = server.client().await;
        let mut dice = Dice::new();
        tokio::spawn(async move {
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(dice.roll(30))).await;
                let _: Result<i64, _> = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .arg("SKIPME")
                    .arg("yes")
                    .query_async(&mut conn)
                    .await;
            }
        })
    };
    let (mut ok, mut failed) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (o, f) = done.unwrap();
        (ok, failed) = (ok + o, failed + f);
    }
    admin.await.unwrap();
    assert!(ok > 1000, "{ok} answered, {failed} failed");
}

/// AUTH with a password and with an ACL user, SELECT of the URL's database, a Unix socket: each
/// connects and answers; a wrong password is an authentication error at connect (the kind
/// redis-rs gives it).
#[tokio::test]
async fn auth_select_and_unix_sockets() {
    let user = lock_testkit::AclUser::new("app", "secret").rules(["~*", "+@all"]);
    let server = RedisServer::builder()
        .requirepass("pw")
        .user(&user)
        .unixsocket()
        .start();
    let urls = [
        format!("redis://:pw@127.0.0.1:{}/3", server.port()),
        format!("redis://app:secret@127.0.0.1:{}/5", server.port()),
        format!("{}?db=7&pass=pw", server.unix_url().unwrap()),
    ];
    for (url, db) in urls.iter().zip([3, 5, 7]) {
        let wire = wire(url, LONG, LONG);
        wire.connect().await.unwrap();
        assert_eq!(wire.db(), db);
        let set = wire
            .command(redis::cmd("SET").arg(format!("in{db}")).arg(db))
            .await
            .unwrap();
        assert_eq!(set, Value::Okay, "{url}");
    }
    let mut conn = server.client().await;
    for db in [3, 5, 7] {
        let _: () = redis::cmd("SELECT")
            .arg(db)
            .query_async(&mut conn)
            .await
            .unwrap();
        let found: Option<i64> = redis::cmd("GET")
            .arg(format!("in{db}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(found, Some(db));
    }
    let wrong = wire(
        &format!("redis://:nope@127.0.0.1:{}/", server.port()),
        LONG,
        LONG,
    );
    let e = wrong.connect().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AuthenticationFailed, "{e:?}");
    assert!(is_closed(&wrong));
}

/// A wire dropped while requests are in flight (on a paused server): its connection's task
/// ends and the server sees no connection left.
#[tokio::test]
async fn a_dropped_wire_ends_its_connection() {
    let mut server = RedisServer::start();
    let wire = wire(&server.url(), LONG, LONG);
    wire.connect().await.unwrap();
    assert_eq!(clients(&server).await, 2);
    server.pause();
    let mut requests = JoinSet::new();
    for _ in 0..4 {
        let wire = wire.clone();
        requests.spawn(async move { wire.command(&redis::cmd("PING")).await });
    }
    tokio::task::yield_now().await;
    requests.abort_all();
    while requests.join_next().await.is_some() {}
    drop(wire);
    server.resume();
    lock_testkit::eventually(
        "the server has no connection but the one asking",
        LONG,
        async || clients(&server).await == 1,
    )
    .await;
}

/// A backend connected in one runtime and used from another after the first was dropped,
/// its connection's task never run: the task was dropped with the runtime, and the next
/// request reconnects rather than waiting on a connection nobody serves.
#[test]
fn a_connection_whose_runtime_was_dropped_is_replaced() {
    let server = RedisServer::start();
    let current = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let wire = wire(&server.url(), SHORT, SHORT);
    let first = current();
    // Connected, its task spawned and not run yet: the runtime is dropped with it.
    first.block_on(wire.connect()).unwrap();
    drop(first);
    current().block_on(async {
        let answer = wire.command(&echo("after")).await.unwrap();
        assert_eq!(answer, Value::BulkString(b"after".to_vec()));
    });
}

/// A connection attempt given up while `AUTH` waits for its answer (the connect timeout
/// fired, or the caller stopped waiting) leaves no connection behind: its task ends, and the
/// server, once it answers again, sees the socket closed.
#[tokio::test]
async fn an_attempt_given_up_during_auth_leaves_no_connection_behind() {
    let mut server = RedisServer::builder().requirepass("pw").start();
    // The connect timeout fires first (AUTH's own wait is the longer response timeout).
    let by_timeout = wire(&server.admin_url(), SHORT, LONG);
    // The caller gives up first.
    let by_caller = wire(&server.admin_url(), LONG, LONG);
    server.pause();
    let e = by_timeout.connect().await.unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(
        tokio::time::timeout(SHORT, by_caller.connect())
            .await
            .is_err()
    );
    server.resume();
    lock_testkit::eventually(
        "the server has no connection but the one asking",
        LONG,
        async || clients(&server).await == 1,
    )
    .await;
    drop((by_timeout, by_caller));
}

/// A wire behind a proxy to a server with a password, connected, then cut off: it has seen
/// its connection close, and new connections through the proxy reach nothing (`AUTH` waits
/// until a timeout).
async fn cut_then_blackholed() -> (RedisServer, Proxy, Wire) {
    let server = RedisServer::builder().requirepass("pw").start();
    let proxy = Proxy::start(([127, 0, 0, 1], server.port()).into()).await;
    let wire = wire(&format!("redis://:pw@{}/", proxy.addr()), SHORT, SHORT);
    wire.connect().await.unwrap();
    proxy.cut();
    lock_testkit::eventually("the connection is seen closed", LONG, async || {
        is_closed(&wire)
    })
    .await;
    proxy.blackhole();
    (server, proxy, wire)
}

/// Requests that find the connection gone while an attempt to make a new one is under way
/// wait for that attempt and share its error: one attempt (and one connect timeout), not one
/// more after it for those that arrived while it ran.
#[tokio::test]
async fn requests_waiting_for_a_failed_attempt_share_its_error() {
    let (_server, proxy, wire) = cut_then_blackholed().await;
    let before = proxy.accepted();
    let mut requests = JoinSet::new();
    for _ in 0..8 {
        let wire = wire.clone();
        requests.spawn(async move { wire.command(&redis::cmd("PING")).await });
    }
    let started = std::time::Instant::now();
    while let Some(answer) = requests.join_next().await {
        assert!(answer.unwrap().unwrap_err().is_timeout());
    }
    assert_eq!(proxy.accepted() - before, 1, "{:?}", started.elapsed());
}

/// A backend connected in one runtime and used from another after the first stopped being
/// driven (alive, never run again): the request that finds the connection's task not running
/// times out, and the next one makes a new connection on its own runtime rather than timing
/// out too, forever.
#[test]
fn a_connection_whose_runtime_is_not_driven_any_more_is_replaced() {
    let server = RedisServer::start();
    let current = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = current();
    let wire = wire(&server.url(), SHORT, SHORT);
    first.block_on(async {
        wire.connect().await.unwrap();
        let answer = wire.command(&echo("before")).await.unwrap();
        assert_eq!(answer, Value::BulkString(b"before".to_vec()));
    });
    // `first` lives on, never driven again.
    current().block_on(async {
        let stalled = wire.command(&echo("stalled")).await.unwrap_err();
        assert!(stalled.is_timeout(), "{stalled:?}");
        for _ in 0..3 {
            let answer = wire.command(&echo("after")).await.unwrap();
            assert_eq!(answer, Value::BulkString(b"after".to_vec()));
        }
    });
    drop(first);
}

/// A pipeline asked for fewer replies than its commands have (or more): the replies beyond
/// those asked for are not handed to the next request, nor is the next request's reply taken.
#[tokio::test]
async fn a_pipeline_takes_its_own_replies_whatever_count_it_asks() {
    let server = RedisServer::start();
    let wire = wire(&server.url(), LONG, SHORT);
    wire.connect().await.unwrap();
    let mut three = redis::pipe();
    three
        .cmd("ECHO")
        .arg("a")
        .cmd("ECHO")
        .arg("b")
        .cmd("ECHO")
        .arg("c");
    let middle = wire.pipeline(&three, 1, 1).await.unwrap();
    assert_eq!(middle, vec![Value::BulkString(b"b".to_vec())]);
    let next = wire.command(&echo("next")).await.unwrap();
    assert_eq!(next, Value::BulkString(b"next".to_vec()));
    let mut one = redis::pipe();
    one.cmd("ECHO").arg("x");
    assert!(wire.pipeline(&one, 0, 2).await.is_err());
    let last = wire.command(&echo("last")).await.unwrap();
    assert_eq!(last, Value::BulkString(b"last".to_vec()));
}

/// A server before Redis 6 (no ACL users) refuses `AUTH user password` as a wrong number of
/// arguments: the connection tries `AUTH password` alone, as redis-rs does (hosted Redis URLs
/// often name a user). No such server is at hand: a peer of our own plays its part, byte for
/// byte.
#[tokio::test]
async fn a_user_name_an_old_server_refuses_is_dropped_from_auth() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let exchange: [(Vec<u8>, &[u8]); 3] = [
            (
                redis::cmd("AUTH").arg("h").arg("pw").get_packed_command(),
                b"-ERR wrong number of arguments for 'auth' command\r\n",
            ),
            (
                redis::cmd("AUTH").arg("pw").get_packed_command(),
                b"+OK\r\n",
            ),
            (redis::cmd("PING").get_packed_command(), b"+PONG\r\n"),
        ];
        for (expected, reply) in exchange {
            let mut got = vec![0; expected.len()];
            socket.read_exact(&mut got).await.unwrap();
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&expected)
            );
            socket.write_all(reply).await.unwrap();
        }
    });
    let wire = wire(&format!("redis://h:pw@127.0.0.1:{port}/"), LONG, LONG);
    wire.connect().await.unwrap();
    let pong = wire.command(&redis::cmd("PING")).await.unwrap();
    assert_eq!(pong, Value::SimpleString("PONG".into()));
    peer.await.unwrap();
}

/// A request whose future made a connection attempt and is then not polled any more (kept by
/// its caller, e.g. a `select!` branch that lost) holds that attempt's turn: other requests
/// wait for it at most the connect timeout, then fail, rather than waiting for good.
#[tokio::test]
async fn a_stuck_attempt_holds_others_back_at_most_the_connect_timeout() {
    let (_server, _proxy, wire) = cut_then_blackholed().await;
    // Polled once: it takes the turn to connect, and waits for AUTH's answer.
    let ping = redis::cmd("PING");
    let mut stuck = Box::pin(wire.command(&ping));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(stuck.as_mut().poll(&mut cx).is_pending());
    let started = std::time::Instant::now();
    let other = tokio::time::timeout(LONG, wire.command(&ping)).await;
    let e = other.expect("no answer within 5 s").unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(started.elapsed() < SHORT * 3, "{:?}", started.elapsed());
    drop(stuck);
}

/// A peer that is not quite Redis, one fault per connection: a RESP3 map, a reply nobody asked
/// for, a reply cut by the close, silence, bytes that are not RESP. Each is an error of its
/// own kind within the response timeout (a retriable I/O error but for silence, a timeout),
/// never a panic or another reply, and the next request makes a new connection. A reply read
/// together with the fault that follows it still reaches its request.
#[tokio::test]
async fn a_peer_that_breaks_the_protocol_gives_typed_errors_and_a_new_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let faults: [&[u8]; 7] = [
        b"%1\r\n+a\r\n+b\r\n",
        b"+PONG\r\n+EXTRA\r\n",
        b"+PONG\r\n\x00\xff not RESP\r\n",
        b"$10\r\nabc",
        b"",
        b"\x00\xff not RESP\r\n",
        b"+PONG\r\n",
    ];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        for reply in faults {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                if !reply.is_empty() {
                    let _ = socket.write_all(reply).await;
                }
                if reply.starts_with(b"$10") {
                    return;
                }
                // Open until the client closes it.
                while socket.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            });
        }
    });
    let wire = wire(&format!("redis://127.0.0.1:{port}/"), SHORT, SHORT);
    let ping = redis::cmd("PING");
    let ask = async || {
        let started = std::time::Instant::now();
        let answer = wire.command(&ping).await;
        assert!(started.elapsed() < SHORT * 3, "{:?}", started.elapsed());
        answer
    };
    let resp3 = ask().await.unwrap_err();
    assert!(resp3.is_io_error() && !resp3.is_timeout(), "{resp3:?}");
    assert_eq!(ask().await.unwrap(), Value::SimpleString("PONG".into()));
    lock_testkit::eventually("the unasked reply ends the connection", LONG, async || {
        is_closed(&wire)
    })
    .await;
    assert_eq!(ask().await.unwrap(), Value::SimpleString("PONG".into()));
    lock_testkit::eventually(
        "the bytes after the reply end the connection",
        LONG,
        async || is_closed(&wire),
    )
    .await;
    let cut = ask().await.unwrap_err();
    assert!(cut.is_io_error() && !cut.is_timeout(), "{cut:?}");
    let silence = ask().await.unwrap_err();
    assert!(silence.is_timeout(), "{silence:?}");
    // Silence is a slow server, not a broken one: the connection stays until it is closed.
    wire.shared
        .link
        .lock()
        .close(io::ErrorKind::ConnectionAborted, "the test moves on");
    let garbage = ask().await.unwrap_err();
    assert!(
        garbage.is_io_error() && !garbage.is_timeout(),
        "{garbage:?}"
    );
    assert_eq!(ask().await.unwrap(), Value::SimpleString("PONG".into()));
}

/// A request queued behind the flusher of its batch (`Link::push`) whose caller keeps its
/// future without polling it again (`select!` on `&mut future`, a branch that lost), on a
/// server slower than the response timeout: it times out (the server is slow), but its
/// connection is not taken for one whose task is not run (nobody asked the task to run: the
/// flusher was to) and replaced, failing every request in flight on it.
#[tokio::test]
async fn a_kept_flusher_on_a_slow_server_does_not_replace_the_connection() {
    let mut server = RedisServer::start();
    let wire = wire(&server.url(), LONG, SHORT);
    wire.connect().await.unwrap();
    server.pause();
    let mut cx = Context::from_waker(Waker::noop());
    let (first, flusher) = (echo("first"), echo("flusher"));
    // Sent, and waits for its answer from the paused server.
    let mut first = Box::pin(wire.command(&first));
    assert!(first.as_mut().poll(&mut cx).is_pending());
    lock_testkit::eventually("the first request is sent", LONG, async || {
        wire.shared.link.lock().state.lock().out.is_empty()
    })
    .await;
    // Queued behind it: the flusher, which yields, and is then kept, never polled again.
    let mut flusher = Box::pin(wire.command(&flusher));
    assert!(flusher.as_mut().poll(&mut cx).is_pending());
    let behind = wire.command(&echo("behind")).await.unwrap_err();
    assert!(behind.is_timeout(), "{behind:?}");
    assert!(!is_closed(&wire), "a slow server taken for a stalled task");
    lock_testkit::eventually("what waited behind the flusher is sent", LONG, async || {
        wire.shared.link.lock().state.lock().out.is_empty()
    })
    .await;
    server.resume();
    let answer = wire.command(&echo("after")).await.unwrap();
    assert_eq!(answer, Value::BulkString(b"after".to_vec()));
    drop((first, flusher));
}

/// A pipeline of many commands, alone on its connection: its replies are handed over in one
/// go, not a chunk per poll of the connection's task (each a trip through the runtime's run
/// queue, behind every task ready to run) when no other request waits for an answer.
#[tokio::test]
async fn a_long_pipeline_is_answered_without_a_poll_per_chunk() {
    let server = RedisServer::start();
    let wire = wire(&server.url(), LONG, LONG);
    wire.connect().await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..512 {
        pipe.cmd("ECHO").arg(i);
    }
    let polls = || wire.shared.link.lock().state.lock().polls;
    let before = polls();
    let replies = wire.pipeline(&pipe, 0, 512).await.unwrap();
    let after = polls();
    assert_eq!(replies.len(), 512);
    assert_eq!(replies[511], Value::BulkString(b"511".to_vec()));
    assert!(after - before < 16, "{} polls", after - before);
}
