//! lock-tower across processes (issue 6): two `lock-http-server` processes (an axum app under
//! `LockLayer`, fenced) share one real redis-server and are driven over loopback by a real
//! HTTP client (hyper-util's pooled client) with 200 concurrent requests over 10 keys.
//!
//! The servers' critical section is a deliberately non-atomic read-modify-write of a counter in
//! Redis, with an overlap probe and a fencing check kept in Redis too, so both processes'
//! sections are judged by one shared state (see `src/bin/lock-http-server.rs`). A control run
//! with the lock layer removed shows that the same checks catch overlapping sections.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "test code: a failed expectation fails the test; figures are printed for the notes"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lock_testkit::{ChildProcess, RedisServer};
use tokio::sync::Barrier;

/// Distinct keys the requests are spread over.
const KEYS: usize = 10;
/// Requests fired at once, split over both servers.
const REQUESTS: usize = 200;
/// Bound on a server's start and on the whole burst (correctness bounds: a hang fails).
const BOUND: Duration = Duration::from_secs(30);

/// One `lock-http-server` process; killed on drop (and it exits when its stdin closes).
struct HttpServer {
    _child: ChildProcess,
    addr: String,
}

impl HttpServer {
    async fn start(redis_url: &str, extra: &[&str]) -> HttpServer {
        let args = [&["--url", redis_url], extra].concat();
        let mut child = ChildProcess::spawn(env!("CARGO_BIN_EXE_lock-http-server"), args);
        let line = child.expect_line("listening ", BOUND).await;
        let addr = line["listening ".len()..].to_owned();
        HttpServer {
            _child: child,
            addr,
        }
    }

    /// The sum of both lock layers' counters, from `GET /metrics`.
    async fn metrics(&self, client: &Client<HttpConnector, Empty<Bytes>>) -> BTreeMap<String, u64> {
        let req = Request::get(format!("http://{}/metrics", self.addr))
            .body(Empty::new())
            .unwrap();
        let response = client.request(req).await.expect("GET /metrics");
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec())
            .unwrap()
            .split_whitespace()
            .map(|field| {
                let (name, value) = field.split_once('=').expect("name=value");
                (name.to_owned(), value.parse().expect("a count"))
            })
            .collect()
    }
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One answered request.
#[derive(Debug)]
struct Answer {
    key: usize,
    server: usize,
    path: String,
    status: StatusCode,
    retry_after: Option<String>,
    content_type: Option<String>,
    body: String,
}

/// Fires every request at once (all tasks pass a barrier first) and collects the answers.
/// `plan(i)` gives request `i`'s key, server index and path.
async fn burst(
    client: &Client<HttpConnector, Empty<Bytes>>,
    servers: &[HttpServer],
    plan: impl Fn(usize) -> (usize, usize, String),
) -> Vec<Answer> {
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..REQUESTS {
        let (key, server, path) = plan(i);
        let uri = format!("http://{}{path}", servers[server].addr);
        let (client, barrier) = (client.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            let req = Request::post(&uri).body(Empty::new()).unwrap();
            let response = client
                .request(req)
                .await
                .unwrap_or_else(|e| panic!("POST {uri}: {e}"));
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .map(|v| v.to_str().unwrap_or("<not text>").to_owned())
            };
            let (status, retry_after, content_type) = (
                response.status(),
                header("retry-after"),
                header("content-type"),
            );
            let body = response.into_body().collect().await.unwrap().to_bytes();
            Answer {
                key,
                server,
                path,
                status,
                retry_after,
                content_type,
                body: String::from_utf8_lossy(&body).into_owned(),
            }
        });
    }
    let mut answers = Vec::with_capacity(REQUESTS);
    let collect = async {
        while let Some(answer) = tasks.join_next().await {
            answers.push(answer.unwrap());
        }
    };
    tokio::time::timeout(BOUND, collect)
        .await
        .expect("every request was answered");
    answers
}

/// An integer kept in Redis by the servers (0 when absent).
async fn int(redis: &RedisServer, key: &str) -> i64 {
    redis
        .get(key)
        .await
        .map_or(0, |v| v.parse().unwrap_or_else(|_| panic!("{key} = {v:?}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_serialize_200_concurrent_requests_per_key_over_http() {
    let redis = RedisServer::start();
    let servers = [
        HttpServer::start(&redis.url(), &[]).await,
        HttpServer::start(&redis.url(), &[]).await,
    ];
    let client = client();
    let started = Instant::now();
    // Request i: key i % 10; the j-th request of a key goes to server j % 2, and every fifth
    // one (j % 5 == 4, on both servers) to the route that rejects instead of waiting.
    let answers = burst(&client, &servers, |i| {
        let (key, j) = (i % KEYS, i / KEYS);
        let route = if j % 5 == 4 { "counter-now" } else { "counter" };
        (key, j % 2, format!("/{route}/k{key}"))
    })
    .await;
    let took = started.elapsed();

    let mut ok = vec![0i64; KEYS];
    let mut conflict = 0;
    let mut tokens: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); KEYS];
    let mut per_server = [0usize; 2];
    for a in &answers {
        per_server[a.server] += 1;
        match a.status {
            StatusCode::OK => {
                ok[a.key] += 1;
                let token: u64 = a.body.parse().unwrap_or_else(|_| panic!("{a:?}"));
                assert!(tokens[a.key].insert(token), "token {token} twice: {a:?}");
            }
            StatusCode::CONFLICT => {
                conflict += 1;
                let retry: u64 = a.retry_after.as_deref().unwrap_or("").parse().unwrap_or(0);
                assert!(retry >= 1, "409 without Retry-After: {a:?}");
                assert_eq!(
                    a.content_type.as_deref(),
                    Some("application/problem+json"),
                    "{a:?}"
                );
            }
            _ => panic!("neither 200 nor 409: {a:?}"),
        }
    }
    assert_eq!(answers.len(), REQUESTS);
    assert_eq!(per_server, [REQUESTS / 2, REQUESTS / 2]);

    let overlaps = int(&redis, "app:overlaps").await;
    let violations = int(&redis, "app:fence_violations").await;
    let total_ok: i64 = ok.iter().sum();
    let mut rejecting_route = 0;
    for a in &answers {
        rejecting_route += usize::from(a.path.starts_with("/counter-now/"));
    }
    let metrics = [
        servers[0].metrics(&client).await,
        servers[1].metrics(&client).await,
    ];
    let sum = |name: &str| metrics.iter().map(|m| m[name]).sum::<u64>();
    println!(
        "{REQUESTS} requests over {KEYS} keys on 2 servers ({rejecting_route} to the rejecting route) in {took:?}: \
         {total_ok} x 200, {conflict} x 409 ({} busy, {} wait timed out); overlaps {overlaps}, \
         fence violations {violations}; 200s per key {ok:?}",
        sum("busy"),
        sum("timeout"),
    );

    assert_eq!(overlaps, 0, "two sections of one key ran at once");
    assert_eq!(violations, 0, "a fencing token did not increase");
    for key in 0..KEYS {
        let name = format!("k{key}");
        assert_eq!(
            int(&redis, &format!("app:{name}:count")).await,
            ok[key],
            "{name}: the counter in Redis is not the number of 200s (lost or extra update)"
        );
        // The first request of a key always gets the lock: the run is never vacuous.
        assert!(ok[key] >= 1, "{name}: no request succeeded");
        assert_eq!(
            int(&redis, &format!("app:{name}:inside")).await,
            0,
            "{name}"
        );
        // The last token stored is the highest any 200 carried: sections ran in token order.
        let highest = tokens[key].last().copied().unwrap_or(0);
        assert_eq!(
            int(&redis, &format!("app:{name}:fence")).await,
            i64::try_from(highest).unwrap(),
            "{name}"
        );
        // Released before the response was sent.
        assert!(
            !redis.exists(&format!("lock:{{counter:{name}}}")).await,
            "{name} still locked"
        );
    }
    // The layers' own counters agree with what the client saw.
    assert_eq!(sum("locked"), u64::try_from(total_ok).unwrap());
    assert_eq!(sum("busy") + sum("timeout"), conflict);
    assert_eq!(sum("unavailable") + sum("lease_lost") + sum("other"), 0);
}

/// The control case: the same load on servers without the lock layer. The checks above must
/// see it (overlapping sections, lost updates), or they prove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_checks_catch_servers_without_the_lock() {
    let redis = RedisServer::start();
    let unlocked = ["--no-lock", "--work-us", "5000"];
    let servers = [
        HttpServer::start(&redis.url(), &unlocked).await,
        HttpServer::start(&redis.url(), &unlocked).await,
    ];
    let client = client();
    let answers = burst(&client, &servers, |i| {
        let (key, j) = (i % KEYS, i / KEYS);
        (key, j % 2, format!("/counter/k{key}"))
    })
    .await;
    assert!(
        answers.iter().all(|a| a.status == StatusCode::OK),
        "{answers:?}"
    );
    let overlaps = int(&redis, "app:overlaps").await;
    let mut counted = 0;
    for key in 0..KEYS {
        counted += int(&redis, &format!("app:k{key}:count")).await;
    }
    let lost = REQUESTS as i64 - counted;
    println!("without the lock: {REQUESTS} x 200, overlaps {overlaps}, lost updates {lost}");
    assert!(
        overlaps > 0 && lost > 0,
        "the checks did not see unlocked sections overlap (overlaps {overlaps}, lost {lost})"
    );
}
