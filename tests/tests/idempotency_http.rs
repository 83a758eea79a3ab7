//! lock-tower's `IdempotencyLayer` across processes (issue 14): `lock-http-server` processes
//! share one real redis-server and serve `POST /pay` behind `IdempotencyLayer` (wait 10 s);
//! a real HTTP client (hyper-util's) sends retries and duplicates to both. The handler counts
//! its runs per key in Redis (`pay:<key>:runs` when it starts, `pay:<key>:done` when it ends),
//! so runs are counted across processes, and every run answers something no other run gives
//! (its run number, process id and time), so a replay is told from a second run by its bytes.
//! See `src/bin/lock-http-server.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lock_testkit::{ChildProcess, RedisServer, eventually};
use tokio::sync::Barrier;

/// Bound on a server's start, on a burst, on a signal awaited (correctness bounds: a hang fails).
const BOUND: Duration = Duration::from_secs(30);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One `lock-http-server` process; killed on drop (and it exits when its stdin closes).
struct HttpServer {
    child: ChildProcess,
    addr: String,
    pid: u32,
}

impl HttpServer {
    async fn start(redis_url: &str, extra: &[&str]) -> HttpServer {
        let args = [&["--url", redis_url], extra].concat();
        let mut child = ChildProcess::spawn(env!("CARGO_BIN_EXE_lock-http-server"), args);
        let line = child.expect_line("listening ", BOUND).await;
        let addr = line["listening ".len()..].to_owned();
        let pid = child.pid().expect("the server runs");
        HttpServer { child, addr, pid }
    }
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One answer as the client saw it.
#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn replayed(&self) -> bool {
        match self.headers.get("idempotent-replayed") {
            None => false,
            Some(v) if v == "true" => true,
            Some(v) => panic!("Idempotent-Replayed: {v:?}"),
        }
    }

    /// What must be the same, byte for byte, in every answer to one key: the status, every
    /// header but the replay marker and hyper's per-message `date`, and the body.
    fn stored_part(&self) -> (StatusCode, Vec<(String, Vec<u8>)>, Bytes) {
        let mut headers: Vec<(String, Vec<u8>)> = self
            .headers
            .iter()
            .filter(|(name, _)| *name != "idempotent-replayed" && *name != "date")
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect();
        headers.sort();
        (self.status, headers, self.body.clone())
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name}: {self:?}"))
            .to_str()
            .unwrap()
    }
}

/// `POST /pay` with `Idempotency-Key: key` and `body`, to `server`.
async fn pay(
    client: &HttpClient,
    server: &str,
    key: &str,
    body: &str,
) -> Result<Answer, hyper_util::client::legacy::Error> {
    let req = Request::post(format!("http://{server}/pay"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(req).await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// An integer kept in Redis by the servers (0 when absent).
async fn int(redis: &RedisServer, key: &str) -> i64 {
    redis
        .get(key)
        .await
        .map_or(0, |v| v.parse().unwrap_or_else(|_| panic!("{key} = {v:?}")))
}

/// Checks one key's answers: the first is a fresh 201 (not replayed), every other one is a
/// replay of it, byte for byte; the handler started and ended exactly once in all processes.
async fn check_key(redis: &RedisServer, key: &str, first: &Answer, others: &[Answer]) {
    assert_eq!(first.status, StatusCode::CREATED, "{key}: {first:?}");
    assert!(!first.replayed(), "{key}: the first answer is a replay");
    assert_eq!(first.header("x-run"), "1", "{key}");
    for other in others {
        assert!(other.replayed(), "{key}: not a replay: {other:?}");
        assert_eq!(
            other.stored_part(),
            first.stored_part(),
            "{key}: a retry's answer is not the first one"
        );
    }
    assert_eq!(int(redis, &format!("pay:{key}:runs")).await, 1, "{key}");
    assert_eq!(int(redis, &format!("pay:{key}:done")).await, 1, "{key}");
}

/// Keys of each phase, and requests per key.
const KEYS: usize = 10;
const N: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_duplicates_across_two_servers_run_the_handler_once_per_key() {
    let redis = RedisServer::start();
    // A hold of 200 ms keeps the first request of a key in flight while its duplicates arrive.
    let servers = [
        HttpServer::start(&redis.url(), &["--hold-ms", "200"]).await,
        HttpServer::start(&redis.url(), &["--hold-ms", "200"]).await,
    ];
    let client = client();

    // N sequential retries per key, alternating between the two processes.
    let started = Instant::now();
    for k in 0..KEYS {
        let key = format!("seq-{k}");
        let body = format!("{k}0 EUR");
        let mut answers = Vec::with_capacity(N);
        for i in 0..N {
            let server = &servers[(k + i) % 2].addr;
            answers.push(pay(&client, server, &key, &body).await.unwrap());
        }
        check_key(&redis, &key, &answers[0], &answers[1..]).await;
    }
    let sequential = started.elapsed();

    // N concurrent duplicates per key, all fired at once (a barrier), half to each process.
    let started = Instant::now();
    let barrier = Arc::new(Barrier::new(KEYS * N));
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..KEYS {
        for i in 0..N {
            let (client, barrier) = (client.clone(), barrier.clone());
            let server = servers[(k + i) % 2].addr.clone();
            tasks.spawn(async move {
                let key = format!("dup-{k}");
                barrier.wait().await;
                let answer = pay(&client, &server, &key, &format!("{k}5 EUR")).await;
                (k, answer.unwrap_or_else(|e| panic!("POST /pay {key}: {e}")))
            });
        }
    }
    let mut answers: Vec<Vec<Answer>> = vec![Vec::new(); KEYS];
    let collect = async {
        while let Some(joined) = tasks.join_next().await {
            let (k, answer) = joined.unwrap();
            answers[k].push(answer);
        }
    };
    tokio::time::timeout(BOUND, collect)
        .await
        .expect("every duplicate was answered");
    let concurrent = started.elapsed();
    let mut served_by = [0usize; 2];
    for (k, answers) in answers.iter_mut().enumerate() {
        let key = format!("dup-{k}");
        assert_eq!(answers.len(), N);
        // Exactly one answer of the key is fresh; it is the first.
        let fresh: Vec<usize> = (0..N).filter(|&i| !answers[i].replayed()).collect();
        assert_eq!(fresh.len(), 1, "{key}: {} fresh answers", fresh.len());
        let first = answers.swap_remove(fresh[0]);
        served_by[usize::from(first.header("x-served-by") == servers[1].pid.to_string())] += 1;
        // A late retry, to each process, replays it too.
        for server in &servers {
            answers.push(
                pay(&client, &server.addr, &key, &format!("{k}5 EUR"))
                    .await
                    .unwrap(),
            );
        }
        check_key(&redis, &key, &first, answers).await;
    }
    println!(
        "{KEYS} keys x {N} sequential retries in {sequential:?}; {KEYS} keys x {N} concurrent \
         duplicates (hold 200 ms) in {concurrent:?}, first runs per process {served_by:?}; \
         handler runs = keys ({}), every other answer a byte-for-byte replay",
        2 * KEYS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_request_leaves_the_outcome_unknown_never_a_second_run() {
    const LEASE_MS: u64 = 1500;
    let lease = LEASE_MS.to_string();
    let redis = RedisServer::start();
    // A holds its handler for a minute: the kill lands mid-handler, with the key's lock held.
    let mut a =
        HttpServer::start(&redis.url(), &["--lease-ms", &lease, "--hold-ms", "60000"]).await;
    let b = HttpServer::start(&redis.url(), &["--lease-ms", &lease]).await;
    let client = client();
    let (key, body) = ("order-7", "70 EUR");

    let first = tokio::spawn({
        let (client, addr) = (client.clone(), a.addr.clone());
        async move { pay(&client, &addr, key, body).await }
    });
    // The handler started in A (its marker in Redis), so A holds the key's lock.
    eventually("A's handler started", BOUND, async || {
        int(&redis, &format!("pay:{key}:runs")).await == 1
    })
    .await;
    // The key's lock, and its "started" mark beside it (written before the handler ran).
    let mut locks = redis.keys("lock:*").await;
    locks.sort();
    assert_eq!(locks.len(), 2, "a lock and its mark: {locks:?}");
    assert_eq!(locks[1], format!("{}:result", locks[0]), "{locks:?}");
    let lock = &locks[0];
    assert!(lock.contains(key), "{lock}");

    a.child.kill().await;
    let killed = Instant::now();
    let remaining = u64::try_from(redis.pttl(lock).await).expect("the lock has a lease");
    assert!(
        remaining > 0 && remaining <= LEASE_MS,
        "A's lock outlives its lease: {remaining} ms"
    );
    let lost = tokio::time::timeout(BOUND, first).await.unwrap().unwrap();
    assert!(lost.is_err(), "A answered after SIGKILL: {lost:?}");

    // The client retries on B: it waits for A's lease to end, then finds A's mark without a
    // result: A may have charged or not, and nobody can tell which. B never runs the handler
    // a second time (issue 29, item 9): 409 outcome-unknown, for every retry in every process
    // until the mark expires with the record's TTL.
    let retry = pay(&client, &b.addr, key, body).await.unwrap();
    let waited = killed.elapsed();
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert!(!retry.replayed(), "{retry:?}");
    assert!(
        String::from_utf8_lossy(&retry.body).contains("urn:lock-tower:idempotency-outcome-unknown"),
        "{retry:?}"
    );
    assert!(
        waited >= Duration::from_millis(remaining),
        "B answered before A's lease ended: {waited:?} after the kill, lease had {remaining} ms"
    );
    let c = HttpServer::start(&redis.url(), &["--lease-ms", &lease]).await;
    for server in [&b, &c, &b, &c] {
        let again = pay(&client, &server.addr, key, body).await.unwrap();
        assert_eq!(again.status, StatusCode::CONFLICT, "{again:?}");
    }
    assert_eq!(
        int(&redis, &format!("pay:{key}:runs")).await,
        1,
        "the handler ran again"
    );
    assert_eq!(int(&redis, &format!("pay:{key}:done")).await, 0);
    assert!(!redis.exists(lock).await, "the lock was released");
    println!(
        "killed A mid-handler with {remaining} ms of lease left; B's retry answered 409 \
         outcome-unknown {waited:?} after the kill, 4 later retries too, no second run"
    );
}
