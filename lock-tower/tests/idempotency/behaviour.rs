//! The layer's behaviour on the memory backend.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Locker, MemoryBackend};
use lock_tower::IdempotencyLayer;
use lock_tower::extract::HeaderKey;

use crate::common::{Call, Handler, a_lost_lease_cancels_the_handler, send, send_with, serve};

#[tokio::test]
async fn sequential_retries_run_once_and_replay_byte_for_byte() {
    let handler = Handler::default();
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let first = send(addr, &Call::new("pay-1", "10 EUR")).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(first.body, "charge #1 tenant - for 10 EUR");
    let mut replays = Vec::new();
    for _ in 0..5 {
        replays.push(send(addr, &Call::new("pay-1", "10 EUR")).await);
    }
    assert_eq!(handler.calls(), 1);
    for replay in &replays {
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(
            replay, &replays[0],
            "every replay is the same, byte for byte"
        );
        assert_eq!(
            replay.without_replay(),
            first,
            "the replay is the first answer"
        );
    }
    assert_eq!(first.header("x-charge"), Some("1"));
    // Another key runs.
    assert_eq!(
        send(addr, &Call::new("pay-2", "10 EUR")).await.body,
        "charge #2 tenant - for 10 EUR"
    );
}

#[tokio::test]
async fn concurrent_duplicates_run_once_others_409() {
    let handler = Handler {
        delay: Duration::from_millis(400),
        ..Handler::default()
    };
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let answers = futures_join(addr, "dup", 8).await;
    assert_eq!(handler.calls(), 1);
    let ran: Vec<_> = answers.iter().filter(|a| a.status == 201).collect();
    assert_eq!(ran.len(), 1, "{answers:?}");
    for a in answers.iter().filter(|a| a.status != 201) {
        assert_eq!(a.status, 409);
        assert_eq!(a.header("retry-after"), Some("1"));
        assert_eq!(a.problem_type(), "urn:lock-tower:idempotency-in-flight");
    }
    // Once finished, a retry replays.
    let retry = send(addr, &Call::new("dup", "x")).await;
    assert!(retry.replayed());
    assert_eq!(retry.without_replay(), *ran[0]);
}

#[tokio::test]
async fn concurrent_duplicates_with_wait_all_get_the_first_answer() {
    let handler = Handler {
        delay: Duration::from_millis(300),
        ..Handler::default()
    };
    let layer = IdempotencyLayer::new(Locker::memory()).wait(Duration::from_secs(10));
    let addr = serve(layer, handler.clone()).await;
    let answers = futures_join(addr, "dup", 8).await;
    assert_eq!(handler.calls(), 1);
    let first = answers.iter().find(|a| !a.replayed()).unwrap().clone();
    assert_eq!(first.status, 201);
    assert_eq!(
        answers.iter().filter(|a| a.replayed()).count(),
        7,
        "{answers:?}"
    );
    for a in &answers {
        assert_eq!(a.without_replay(), first);
    }
}

async fn futures_join(
    addr: std::net::SocketAddr,
    key: &'static str,
    n: usize,
) -> Vec<crate::common::Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(async move { send(addr, &Call::new(key, "x")).await }))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn changed_payload_or_path_is_422_not_a_replay() {
    let handler = Handler::default();
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    assert_eq!(send(addr, &Call::new("k", "10 EUR")).await.status, 201);
    let changed = send(addr, &Call::new("k", "99 EUR")).await;
    assert_eq!(changed.status, 422);
    assert_eq!(
        changed.problem_type(),
        "urn:lock-tower:idempotency-key-reused"
    );
    // Another path with the same key and body is another request too (DESIGN: the
    // fingerprint is method, path and body): 422, never a second run under one key.
    let refund = send(
        addr,
        &Call {
            path: "/refunds",
            ..Call::new("k", "10 EUR")
        },
    )
    .await;
    assert_eq!(refund.status, 422);
    assert_eq!(
        refund.problem_type(),
        "urn:lock-tower:idempotency-key-reused"
    );
    assert_eq!(handler.calls(), 1);
    assert!(send(addr, &Call::new("k", "10 EUR")).await.replayed());
    // Another key on that path runs.
    let other = Call {
        path: "/refunds",
        ..Call::new("k2", "10 EUR")
    };
    assert_eq!(send(addr, &other).await.status, 201);
    assert_eq!(handler.calls(), 2);
}

#[tokio::test]
async fn no_key_passes_through_or_is_400_when_required() {
    let handler = Handler::default();
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let no_key = Call {
        key: None,
        ..Call::new("", "a")
    };
    assert_eq!(send(addr, &no_key).await.status, 201);
    assert_eq!(send(addr, &no_key).await.status, 201);
    assert_eq!(handler.calls(), 2);

    let strict = Handler::default();
    let addr = serve(
        IdempotencyLayer::new(Locker::memory()).require_key(),
        strict.clone(),
    )
    .await;
    let answer = send(addr, &no_key).await;
    assert_eq!(answer.status, 400);
    assert_eq!(
        answer.problem_type(),
        "urn:lock-tower:idempotency-key-missing"
    );
    let empty = send(
        addr,
        &Call {
            key: Some(b""),
            ..no_key
        },
    )
    .await;
    assert_eq!(empty.status, 400);
    assert_eq!(strict.calls(), 0);
}

/// Two `Idempotency-Key` headers are not a key (the header is one structured item): 400
/// `invalid-key` and the handler does not run. Before, the first was taken silently, so a
/// retry whose keys came in another order ran as a new request.
#[tokio::test]
async fn a_repeated_key_header_is_400_and_runs_nothing() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let handler = Handler::default();
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    for (first, second) in [("a", "b"), ("b", "a"), ("a", "a")] {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /payments HTTP/1.1\r\nhost: test\r\nidempotency-key: {first}\r\n\
             idempotency-key: {second}\r\ncontent-length: 6\r\nconnection: close\r\n\r\n10 EUR"
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        assert!(answer.contains("urn:lock-tower:invalid-key"), "{answer}");
        assert!(answer.contains("repeated"), "{answer}");
    }
    assert_eq!(handler.calls(), 0);
    // One key still works.
    assert_eq!(send(addr, &Call::new("a", "10 EUR")).await.status, 201);
}

#[tokio::test]
async fn bodies_over_max_body_are_413() {
    let handler = Handler::default();
    let addr = serve(
        IdempotencyLayer::new(Locker::memory()).max_body(16),
        handler.clone(),
    )
    .await;
    let big = "x".repeat(17);
    let answer = send(addr, &Call::new("k", &big)).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.problem_type(), "urn:lock-tower:payload-too-large");
    assert_eq!(handler.calls(), 0);
    assert_eq!(send(addr, &Call::new("k", &big[..16])).await.status, 201);
}

#[tokio::test]
async fn server_errors_are_not_stored() {
    let handler = Handler {
        fail_on: vec![1],
        ..Handler::default()
    };
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let failed = send(addr, &Call::new("k", "a")).await;
    assert_eq!(failed.status, 500);
    let retried = send(addr, &Call::new("k", "a")).await;
    assert_eq!(retried.status, 201);
    assert!(!retried.replayed());
    assert_eq!(handler.calls(), 2);
    assert!(send(addr, &Call::new("k", "a")).await.replayed());
    assert_eq!(handler.calls(), 2);
}

#[tokio::test]
async fn ttl_expiry_lets_the_key_run_again() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::new(Locker::memory()).ttl(Duration::from_millis(500));
    let addr = serve(layer, handler.clone()).await;
    assert_eq!(send(addr, &Call::new("k", "a")).await.status, 201);
    assert!(send(addr, &Call::new("k", "a")).await.replayed());
    tokio::time::sleep(Duration::from_millis(700)).await;
    let again = send(addr, &Call::new("k", "a")).await;
    assert_eq!(again.status, 201);
    assert!(!again.replayed());
    assert_eq!(handler.calls(), 2);
}

/// Issue 29, item 14: records are scoped to the caller by default. Two clients with other
/// credentials (`Authorization`, else `Cookie`) that send the same key and body each run
/// their own request: the second never gets the first's stored response (its `Set-Cookie`
/// and all). The same credentials get the replay; `.shared_records()` shares records again.
#[tokio::test]
async fn records_are_scoped_to_the_caller_by_default() {
    let handler = Handler::default();
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let call = Call::new("k", "10 EUR");
    let alice = [("authorization", "Bearer alice")];
    let mallory = [("authorization", "Bearer mallory")];
    let first = send_with(addr, &call, &alice).await;
    assert_eq!((first.status, first.replayed()), (201, false));
    let other = send_with(addr, &call, &mallory).await;
    assert!(!other.replayed(), "another caller got the stored response");
    assert_eq!(other.body, "charge #2 tenant - for 10 EUR");
    assert!(send_with(addr, &call, &alice).await.replayed());
    assert!(send_with(addr, &call, &mallory).await.replayed());
    assert_eq!(handler.calls(), 2);
    // Cookies when there is no Authorization; a request with neither is anonymous.
    let (a, b) = ([("cookie", "session=a")], [("cookie", "session=b")]);
    assert!(!send_with(addr, &Call::new("c", "x"), &a).await.replayed());
    assert!(!send_with(addr, &Call::new("c", "x"), &b).await.replayed());
    assert!(!send(addr, &Call::new("c", "x")).await.replayed());
    assert!(send_with(addr, &Call::new("c", "x"), &b).await.replayed());
    assert!(send(addr, &Call::new("c", "x")).await.replayed());
    assert_eq!(handler.calls(), 5);
    // Opted out: one scope for every caller.
    let handler = Handler::default();
    let layer = IdempotencyLayer::new(Locker::memory()).shared_records();
    let addr = serve(layer, handler.clone()).await;
    assert!(!send_with(addr, &call, &alice).await.replayed());
    assert!(send_with(addr, &call, &mallory).await.replayed());
    assert_eq!(handler.calls(), 1);
}

/// Issue 29, item 14 (review): one cookie set, sent as HTTP/2 "crumbs" (one `cookie` field
/// per cookie, RFC 9113 8.2.3) by one attempt and as one `Cookie` line by its retry (over
/// HTTP/1.1, or through a proxy that joins them), is one caller: the retry is replayed, not
/// run again as another caller's request. Before, the lines were hashed as they came, and
/// the retry ran the handler a second time.
#[tokio::test]
async fn cookie_crumbs_and_one_cookie_line_are_one_caller() {
    let handler = Handler::default();
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let call = Call::new("k", "10 EUR");
    let crumbs = [("cookie", "sid=a"), ("cookie", "theme=dark")];
    let first = send_with(addr, &call, &crumbs).await;
    assert_eq!((first.status, first.replayed()), (201, false));
    let retry = send_with(addr, &call, &[("cookie", "sid=a; theme=dark")]).await;
    assert!(retry.replayed(), "the retry ran again: {:?}", retry.body);
    assert_eq!(handler.calls(), 1);
    // Another cookie set is still another caller.
    let other = send_with(addr, &call, &[("cookie", "sid=b; theme=dark")]).await;
    assert!(!other.replayed());
    assert_eq!(handler.calls(), 2);
}

#[tokio::test]
async fn scope_keeps_two_principals_apart() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::new(Locker::memory()).scope(HeaderKey::new("x-tenant"));
    let addr = serve(layer, handler.clone()).await;
    let acme = Call {
        tenant: Some("acme"),
        ..Call::new("k", "a")
    };
    let globex = Call {
        tenant: Some("globex"),
        ..Call::new("k", "a")
    };
    let a = send(addr, &acme).await;
    let g = send(addr, &globex).await;
    assert_eq!((a.status, g.status), (201, 201));
    assert_eq!(a.body, "charge #1 tenant acme for a");
    assert_eq!(g.body, "charge #2 tenant globex for a");
    assert_eq!(send(addr, &acme).await.without_replay(), a);
    assert_eq!(send(addr, &globex).await.without_replay(), g);
    assert_eq!(handler.calls(), 2);
}

#[tokio::test]
async fn hostile_keys_are_bounded_and_still_work() {
    let handler = Handler::default();
    let layer = IdempotencyLayer::new(Locker::memory());
    let addr = serve(layer.clone(), handler.clone()).await;
    let huge = vec![b'k'; 8000];
    let odd: &[u8] = b"\xff\xfe\x80 #sha256:\t";
    let hash_like = format!("#sha256:{}", "0".repeat(64));
    for (i, key) in [&huge[..], odd, hash_like.as_bytes()]
        .into_iter()
        .enumerate()
    {
        let record = layer.record_key(b"", key).unwrap();
        assert!(record.len() <= 256, "{} bytes", record.len());
        assert!(!record.chars().any(char::is_control));
        let call = Call {
            key: Some(key),
            ..Call::new("", "a")
        };
        let first = send(addr, &call).await;
        assert_eq!(first.status, 201);
        assert_eq!(handler.calls(), i + 1);
        assert!(send(addr, &call).await.replayed());
    }
    // The hashed form of a value is not a value's own key.
    assert_ne!(
        layer.record_key(b"", hash_like.as_bytes()),
        layer.record_key(b"", odd),
    );
    // A principal cannot forge another's key: the principal is length-prefixed.
    assert_ne!(
        layer.record_key(b"a 1:b", b"k"),
        layer.record_key(b"a", b"1:b k"),
    );
}

#[tokio::test]
async fn too_large_responses_never_run_twice() {
    let handler = Handler {
        big: Some(lock_core::MAX_RESULT_LEN + 1),
        ..Handler::default()
    };
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let first = send(addr, &Call::new("k", "a")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), lock_core::MAX_RESULT_LEN + 1);
    let again = send(addr, &Call::new("k", "a")).await;
    assert_eq!(again.status, 409);
    assert_eq!(
        again.problem_type(),
        "urn:lock-tower:idempotency-response-not-stored"
    );
    assert_eq!(handler.calls(), 1);
}

#[tokio::test]
async fn a_client_gone_mid_request_does_not_make_the_retry_run_again() {
    let handler = Handler {
        delay: Duration::from_millis(500),
        ..Handler::default()
    };
    let layer = IdempotencyLayer::new(Locker::memory()).detach_handler();
    let addr = serve(layer, handler.clone()).await;
    let gone =
        tokio::time::timeout(Duration::from_millis(100), send(addr, &Call::new("k", "a"))).await;
    assert!(gone.is_err());
    // The server notices the closed connection and drops the request; the handler runs on.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let during = send(addr, &Call::new("k", "a")).await;
    assert_eq!(during.status, 409, "{during:?}");
    assert_eq!(
        during.problem_type(),
        "urn:lock-tower:idempotency-in-flight"
    );
    // Once it finished, its response was stored: the retry replays it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let retry = send(addr, &Call::new("k", "a")).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(retry.body, "charge #1 tenant - for a");
    assert_eq!(
        handler.calls(),
        1,
        "at most once, though the first client left"
    );
}

/// Without `detach_handler`, a request dropped mid-handler cancels the handler and stores
/// nothing; its "started" mark stays, so the retry is told the outcome is unknown (409) and
/// never runs the handler a second time (issue 29, item 9; it ran again before).
#[tokio::test]
async fn a_request_dropped_mid_handler_leaves_the_outcome_unknown() {
    use tower::ServiceExt as _;
    let handler = Handler {
        delay: Duration::from_secs(30),
        ..Handler::default()
    };
    let app = axum::Router::new()
        .route("/payments", axum::routing::post(crate::common::charge))
        .layer(IdempotencyLayer::new(Locker::memory()))
        .with_state(handler.clone());
    let request = || {
        http::Request::post("/payments")
            .header("idempotency-key", "k")
            .body(axum::body::Body::from("a"))
            .unwrap()
    };
    let dropped = tokio::time::timeout(Duration::from_millis(100), app.clone().oneshot(request()));
    assert!(
        dropped.await.is_err(),
        "the first request is dropped mid-handler"
    );
    assert_eq!(handler.calls(), 1);
    // The dropped guard's release runs in the background: 409 in flight until it has.
    lock_testkit::eventually(
        "the retry is answered",
        Duration::from_secs(10),
        async || {
            let (status, body, _) =
                crate::common::summary(app.clone().oneshot(request()).await.unwrap()).await;
            assert_eq!(status, 409, "{body}");
            body.contains("urn:lock-tower:idempotency-outcome-unknown")
        },
    )
    .await;
    assert_eq!(handler.calls(), 1, "the handler ran again");
}

#[tokio::test]
async fn a_client_gone_mid_request_then_a_waiting_retry_gets_the_first_answer() {
    let handler = Handler {
        delay: Duration::from_millis(400),
        ..Handler::default()
    };
    let layer = IdempotencyLayer::new(Locker::memory())
        .wait(Duration::from_secs(5))
        .detach_handler();
    let addr = serve(layer, handler.clone()).await;
    let gone =
        tokio::time::timeout(Duration::from_millis(100), send(addr, &Call::new("k", "a"))).await;
    assert!(gone.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retry = send(addr, &Call::new("k", "a")).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, "charge #1 tenant - for a");
    assert_eq!(handler.calls(), 1);
}

#[tokio::test]
async fn a_ttl_out_of_range_answers_500_without_running_the_handler() {
    for ttl in [
        Duration::ZERO,
        lock_core::MAX_RESULT_TTL + Duration::from_secs(1),
    ] {
        let handler = Handler::default();
        let layer = IdempotencyLayer::new(Locker::memory()).ttl(ttl);
        let addr = serve(layer, handler.clone()).await;
        for _ in 0..2 {
            let answer = send(addr, &Call::new("k", "a")).await;
            assert_eq!(answer.status, 500, "{answer:?}");
            assert_eq!(answer.problem_type(), "urn:lock-tower:misconfigured");
        }
        assert_eq!(handler.calls(), 0, "ttl {ttl:?}: the handler never runs");
    }
}

#[tokio::test]
async fn a_response_body_that_fails_is_recorded_and_not_run_again() {
    let handler = Handler {
        broken_body: true,
        ..Handler::default()
    };
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    let first = send(addr, &Call::new("k", "a")).await;
    assert_eq!(first.status, 500, "{first:?}");
    let retry = send(addr, &Call::new("k", "a")).await;
    assert_eq!(retry.status, 409, "{retry:?}");
    assert_eq!(
        retry.problem_type(),
        "urn:lock-tower:idempotency-response-not-stored"
    );
    assert_eq!(handler.calls(), 1);
}

#[tokio::test]
async fn answers_not_processed_or_not_now_are_not_stored() {
    for status in [400, 401, 404, 405, 408, 413, 415, 429] {
        let handler = Handler {
            status: Some(status),
            ..Handler::default()
        };
        let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
        for _ in 0..2 {
            let answer = send(addr, &Call::new("k", "a")).await;
            assert_eq!(answer.status, status);
            assert!(!answer.replayed());
        }
        assert_eq!(handler.calls(), 2, "{status} is not stored: the retry runs");
    }
    // Another 4xx from the handler is its answer, stored and replayed.
    let handler = Handler {
        status: Some(409),
        ..Handler::default()
    };
    let addr = serve(IdempotencyLayer::new(Locker::memory()), handler.clone()).await;
    assert_eq!(send(addr, &Call::new("k", "a")).await.status, 409);
    assert!(send(addr, &Call::new("k", "a")).await.replayed());
    assert_eq!(handler.calls(), 1);
}

#[tokio::test]
async fn a_store_after_a_lost_lease_is_503_not_success() {
    let backend = MemoryBackend::new();
    let locker = Locker::builder(backend.clone()).build();
    let layer = IdempotencyLayer::new(locker);
    let key = layer.record_key(b"", b"k").unwrap();
    let handler = Handler {
        delay: Duration::from_millis(300),
        ..Handler::default()
    };
    let addr = serve(layer, handler.clone()).await;
    let request = tokio::spawn(async move { send(addr, &Call::new("k", "a")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(backend.force_delete(&key), "the request holds the lock");
    let answer = request.await.unwrap();
    assert_eq!(answer.status, 503);
    assert_eq!(answer.problem_type(), "urn:lock-tower:lease-lost");
    // Nothing was stored, and the handler ran: the retry is told the outcome is unknown.
    let retry = send(addr, &Call::new("k", "a")).await;
    assert_eq!(retry.status, 409);
    assert_eq!(
        retry.problem_type(),
        "urn:lock-tower:idempotency-outcome-unknown"
    );
    assert_eq!(handler.calls(), 1);
}

#[tokio::test]
async fn a_lost_lease_cancels_the_handler_before_a_retry_runs() {
    for detach in [false, true] {
        let backend = MemoryBackend::new();
        let locker = Locker::builder(backend.clone())
            .lease(Duration::from_millis(600))
            .build();
        a_lost_lease_cancels_the_handler(locker, detach, async |key| {
            assert!(backend.force_delete(&key), "the request holds the lock");
        })
        .await;
    }
}

/// A charge handler on `/accounts/{acct}/charges` that counts its calls and names the account.
fn charges(calls: &Arc<std::sync::atomic::AtomicUsize>) -> axum::routing::MethodRouter {
    let calls = calls.clone();
    axum::routing::post(
        move |axum::extract::Path(acct): axum::extract::Path<String>| async move {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            (http::StatusCode::CREATED, format!("charge #{n} on {acct}"))
        },
    )
}

/// Status, body and whether it was replayed, for a POST of `10 EUR` to `uri` with key `k`.
async fn charge(app: &axum::Router, uri: &str) -> (u16, String, bool) {
    charge_keyed(app, uri, "k").await
}

/// [`charge`] with the key `key`.
async fn charge_keyed(app: &axum::Router, uri: &str, key: &str) -> (u16, String, bool) {
    use tower::ServiceExt as _;
    let request = http::Request::post(uri)
        .header("idempotency-key", key)
        .body(axum::body::Body::from("10 EUR"))
        .unwrap();
    crate::common::summary(app.clone().oneshot(request).await.unwrap()).await
}

/// Under `Router::nest("/accounts/{acct}", ..)` the layer sees the path the client sent, not
/// what the nesting router left of it: bob's charge with the same key and body as alice's is
/// another request (422), never alice's stored answer; with a key of its own it runs for bob.
/// Before, both were `/charges` to the layer, and bob got alice's stored answer.
#[tokio::test]
async fn under_a_nest_another_accounts_request_is_not_answered_with_this_ones_record() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let account = axum::Router::new()
        .route("/charges", charges(&calls))
        .layer(IdempotencyLayer::new(Locker::memory()));
    let app = axum::Router::new().nest("/accounts/{acct}", account);
    let alice = charge(&app, "/accounts/alice/charges").await;
    assert_eq!(alice, (201, "charge #1 on alice".into(), false));
    let bob = charge(&app, "/accounts/bob/charges").await;
    assert_eq!((bob.0, bob.2), (422, false), "{bob:?}");
    let bob = charge_keyed(&app, "/accounts/bob/charges", "k-bob").await;
    assert_eq!(bob, (201, "charge #2 on bob".into(), false));
    // Alice's retry is still hers.
    let retry = charge(&app, "/accounts/alice/charges").await;
    assert_eq!(retry, (201, "charge #1 on alice".into(), true));
}

/// A retry whose path is percent-encoded another way (`/accounts/%61lice`: a proxy or a client
/// library re-encoding it) is the same request: it is replayed. Before, the raw path made it
/// another record, and the charge ran twice.
#[tokio::test]
async fn a_retry_with_the_path_encoded_another_way_is_replayed() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/accounts/{acct}/charges", charges(&calls))
        .layer(IdempotencyLayer::new(Locker::memory()));
    let first = charge(&app, "/accounts/alice/charges").await;
    assert_eq!(first, (201, "charge #1 on alice".into(), false));
    let retry = charge(&app, "/accounts/%61lice/charges").await;
    assert_eq!(retry, (201, "charge #1 on alice".into(), true));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // An escaped reserved character is not equal to itself unescaped (RFC 3986): a retry that
    // re-encodes one is another request under the same key, 422, never a second run.
    let first = charge_keyed(&app, "/accounts/a;b/charges", "semi").await;
    assert_eq!(first, (201, "charge #2 on a;b".into(), false));
    let reencoded = charge_keyed(&app, "/accounts/a%3Bb/charges", "semi").await;
    assert_eq!((reencoded.0, reencoded.2), (422, false), "{reencoded:?}");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A LockLayer outside the idempotency layer serializes requests for one resource, whatever
/// their idempotency keys. A request dropped mid-handler (the client went away) must cancel
/// its handler with it: a handler outliving the drop would run beside the next request the
/// LockLayer lets in.
#[tokio::test]
async fn a_lock_layer_outside_keeps_handlers_apart_when_a_request_is_dropped() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt as _;

    let locker = Locker::memory();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (in_flight, most) = (in_flight.clone(), most.clone());
        move || async move {
            /// Leaves the count when the handler ends, cancelled or not.
            struct Running(Arc<AtomicUsize>);
            impl Drop for Running {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            let _running = Running(in_flight);
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            "paid"
        }
    };
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(handler))
        .layer(IdempotencyLayer::new(locker.clone()))
        .layer(lock_tower::LockLayer::new(
            locker,
            HeaderKey::new("x-resource"),
        ));
    let request = |key: &str| {
        http::Request::post("/pay")
            .header("x-resource", "order-1")
            .header("idempotency-key", key)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let dropped =
        tokio::time::timeout(Duration::from_millis(50), app.clone().oneshot(request("a"))).await;
    assert!(
        dropped.is_err(),
        "the first request was dropped mid-handler"
    );
    let second = app.oneshot(request("b")).await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two handlers ran at once under one LockLayer key"
    );
}

/// One key sent with another method (same path, same body) is a key reused for another
/// request: 422, and the handler runs once (DESIGN: the fingerprint is method, path and body).
#[tokio::test]
async fn the_same_key_with_another_method_is_422_not_a_second_run() {
    use tower::ServiceExt as _;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = move || {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        async move { (http::StatusCode::CREATED, format!("#{n}")) }
    };
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(handler.clone()).put(handler))
        .layer(IdempotencyLayer::new(Locker::memory()));
    let send = |method: http::Method| {
        let request = http::Request::builder()
            .method(method)
            .uri("/pay")
            .header("idempotency-key", "k")
            .body(axum::body::Body::from("10 EUR"))
            .unwrap();
        app.clone().oneshot(request)
    };
    assert_eq!(send(http::Method::POST).await.unwrap().status(), 201);
    let put = send(http::Method::PUT).await.unwrap();
    assert_eq!(put.status(), 422);
    assert!(!put.headers().contains_key("idempotent-replayed"));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    let retry = send(http::Method::POST).await.unwrap();
    assert!(retry.headers().contains_key("idempotent-replayed"));
}

/// axum routes on the path as sent: `/items/me` goes to the route `/items/me`, `/items/%6De`
/// to `/items/{id}`. One key used for both is a key reused for another request (422), never
/// the first handler's answer replayed for the second. Found by review: both paths normalize
/// to `/items/me`, and the second request got the static route's stored response.
#[tokio::test]
async fn a_request_routed_to_another_handler_is_never_answered_with_this_ones_record() {
    let app = axum::Router::new()
        .route(
            "/items/me",
            axum::routing::post(|| async { (http::StatusCode::CREATED, "static me") }),
        )
        .route(
            "/items/{id}",
            axum::routing::post(
                |axum::extract::Path(id): axum::extract::Path<String>| async move {
                    (http::StatusCode::CREATED, format!("param {id}"))
                },
            ),
        )
        .layer(IdempotencyLayer::new(Locker::memory()));
    let routed = charge_keyed(&app, "/items/%6De", "other").await;
    assert_eq!(routed, (201, "param me".into(), false), "axum's routing");
    let first = charge(&app, "/items/me").await;
    assert_eq!(first, (201, "static me".into(), false));
    let second = charge(&app, "/items/%6De").await;
    assert_eq!(second.0, 422, "{second:?}");
    assert!(!second.2, "{second:?}");
    // The first handler's own retry is still replayed.
    assert_eq!(
        charge(&app, "/items/me").await,
        (201, "static me".into(), true)
    );
}
