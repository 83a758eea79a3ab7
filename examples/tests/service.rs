//! The HTTP contract of the shop service, on the memory backend: status codes, problem types,
//! idempotent replays.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions fail the test by panicking, by design"
)]

use axum::http::StatusCode;
use lock_examples::client::ShopClient;
use lock_examples::problem::{ALREADY_ENTERED, INVALID_REQUEST, LOCK_BUSY, NOT_FOUND, SOLD_OUT};
use lock_examples::{Entry, ReserveRequest, RunningServer, Shop, ShopConfig};

async fn start() -> (Shop, RunningServer, String) {
    let shop = Shop::memory(ShopConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = shop.spawn(listener).unwrap();
    let base = server.base_url();
    (shop, server, base)
}

fn buy(user: &str, quantity: u32) -> ReserveRequest {
    ReserveRequest {
        user: user.into(),
        quantity,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_lock_and_sold_out_are_different_409s() {
    let (shop, server, base) = start().await;
    shop.inventory().seed("sku-1", 1).await.unwrap();
    let client = ShopClient::new();

    // Someone holds the SKU's lock: a no-wait reservation is turned away as lock-busy.
    let held = shop
        .locker()
        .lock(lock_examples::inventory::lock_key("sku-1"))
        .await
        .unwrap();
    let busy = client
        .reserve(&base, "sku-1", &buy("a", 1), true)
        .await
        .unwrap();
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert!(
        busy.problem().unwrap().is(LOCK_BUSY),
        "{:?}",
        busy.problem()
    );
    assert_eq!(client.stock(&base, "sku-1").await.unwrap().stock, 1);
    held.release().await.unwrap();

    let sold = client
        .reserve(&base, "sku-1", &buy("a", 1), true)
        .await
        .unwrap();
    assert_eq!(sold.status, StatusCode::OK);

    // Nothing left: a sold-out 409, whose type says so.
    let out = client
        .reserve(&base, "sku-1", &buy("b", 1), false)
        .await
        .unwrap();
    assert_eq!(out.status, StatusCode::CONFLICT);
    let problem = out.problem().unwrap();
    assert!(problem.is(SOLD_OUT), "{problem:?}");
    assert!(!problem.is(LOCK_BUSY));

    let view = client.stock(&base, "sku-1").await.unwrap();
    assert_eq!((view.stock, view.sold, view.sales), (0, 1, 1));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reservation_gets_the_lock_once_it_is_released() {
    let (shop, server, base) = start().await;
    shop.inventory().seed("sku-2", 5).await.unwrap();
    let client = ShopClient::new();
    let held = shop
        .locker()
        .lock(lock_examples::inventory::lock_key("sku-2"))
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let (client, base) = (client.clone(), base.clone());
        async move { client.reserve(&base, "sku-2", &buy("w", 2), false).await }
    });
    // lock-core has no "someone queued" signal; its waiter count is the closest thing: poll it.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while shop.locker().stats().waiters == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request never queued for the lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // It is queued behind our lock, so it cannot have touched the stock.
    assert_eq!(client.stock(&base, "sku-2").await.unwrap().stock, 5);
    assert!(!waiting.is_finished());
    held.release().await.unwrap();
    let reply = waiting.await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(client.stock(&base, "sku-2").await.unwrap().stock, 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_idempotency_key_same_answer_and_a_second_draw_is_refused() {
    let (shop, server, base) = start().await;
    shop.lottery().seed("spring", 2).await.unwrap();
    let client = ShopClient::new();

    let first = client.enter(&base, "spring", "carol", "k-1").await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let entry: Entry = first.json().unwrap();
    assert_eq!(entry.user, "carol");
    for _ in 0..3 {
        let retry = client.enter(&base, "spring", "carol", "k-1").await.unwrap();
        assert_eq!((retry.status, &retry.body), (first.status, &first.body));
    }

    let again = client.enter(&base, "spring", "carol", "k-2").await.unwrap();
    assert_eq!(again.status, StatusCode::CONFLICT);
    let problem = again.problem().unwrap();
    assert!(problem.is(ALREADY_ENTERED), "{problem:?}");
    let existing: Entry = serde_json::from_value(*problem.existing.unwrap()).unwrap();
    assert_eq!(existing, entry);

    let view = client.draw(&base, "spring").await.unwrap();
    assert_eq!(view.entries, vec!["carol".to_owned()]);
    assert_eq!(view.winners.len(), usize::from(entry.won));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_problem_json_400s_and_unknown_things_404s() {
    let (shop, server, base) = start().await;
    shop.inventory().seed("sku-3", 5).await.unwrap();
    shop.lottery().seed("summer", 1).await.unwrap();
    let client = ShopClient::new();

    for (sku, request) in [
        ("sku-3", buy("x", 0)),
        ("sku-3", buy("x", 1001)),
        ("sku-3", buy("a:b", 1)),
        ("a%3Ab", buy("x", 1)),
    ] {
        let reply = client.reserve(&base, sku, &request, false).await.unwrap();
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{sku} {request:?}");
        assert!(reply.problem().unwrap().is(INVALID_REQUEST));
    }
    let unknown = client
        .reserve(&base, "no-such-sku", &buy("x", 1), false)
        .await
        .unwrap();
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.problem().unwrap().is(NOT_FOUND));

    let no_draw = client.enter(&base, "winter", "dave", "k").await.unwrap();
    assert_eq!(no_draw.status, StatusCode::NOT_FOUND);
    let bad_key = client.enter(&base, "summer", "dave", "").await.unwrap();
    assert_eq!(bad_key.status, StatusCode::BAD_REQUEST);
    assert!(bad_key.problem().unwrap().is(INVALID_REQUEST));

    assert!(client.stock(&base, "no-such-sku").await.is_err());
    assert_eq!(client.stock(&base, "sku-3").await.unwrap().stock, 5);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_charges_once_per_idempotency_key_and_replays_the_first_answer() {
    let (shop, server, base) = start().await;
    let client = ShopClient::new();
    let order = lock_examples::CheckoutRequest {
        order: "o-1".into(),
        user: "alice".into(),
        amount_cents: 1999,
    };

    let first = client.checkout(&base, "pay-1", &order).await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed);
    let retry = client.checkout(&base, "pay-1", &order).await.unwrap();
    assert!(retry.replayed);
    assert_eq!((retry.status, &retry.body), (first.status, &first.body));
    assert_eq!(shop.payments().charges("o-1").await.unwrap().len(), 1);

    // Same key, another payload: refused, nothing charged.
    let changed = lock_examples::CheckoutRequest {
        amount_cents: 1,
        ..order.clone()
    };
    let refused = client.checkout(&base, "pay-1", &changed).await.unwrap();
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    // Another key is another payment.
    let other = client.checkout(&base, "pay-2", &order).await.unwrap();
    assert_eq!(other.status, StatusCode::CREATED);
    assert_ne!(other.body, first.body);
    let charges = client.payments(&base, "o-1").await.unwrap();
    assert_eq!(charges.len(), 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_over_http_in_prometheus_text() {
    let (shop, server, base) = start().await;
    shop.inventory().seed("sku-scraped-7", 5).await.unwrap();
    let client = ShopClient::new();
    for user in ["a", "b"] {
        let reply = client
            .reserve(&base, "sku-scraped-7", &buy(user, 1), false)
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK);
    }
    let held = shop
        .locker()
        .lock(lock_examples::inventory::lock_key("sku-scraped-7"))
        .await
        .unwrap();
    let busy = client
        .reserve(&base, "sku-scraped-7", &buy("c", 1), true)
        .await
        .unwrap();
    assert_eq!(busy.status, StatusCode::CONFLICT);
    held.release().await.unwrap();

    let text = client.metrics(&base).await.unwrap();
    use lock_examples::metrics::{SKU_CLASS, value};
    let sku = ("class", SKU_CLASS);
    let count = |outcome: &str| {
        value(
            &text,
            "lock_acquire_duration_seconds_count",
            &[sku, ("backend", "memory"), ("outcome", outcome)],
        )
        .unwrap_or(0.0)
    };
    // Other tests of this binary share the process's recorder: at least ours.
    assert!(count("acquired") >= 2.0, "{text}");
    assert!(count("busy") >= 1.0, "{text}");
    assert!(
        value(
            &text,
            "lock_layer_requests_total",
            &[sku, ("outcome", "busy")]
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
    assert!(
        value(
            &text,
            "lock_held_duration_seconds",
            &[sku, ("quantile", "0.99")]
        )
        .is_some(),
        "{text}"
    );
    assert!(value(&text, "lock_held", &[sku]).is_some(), "{text}");
    assert!(
        text.contains("# TYPE lock_acquire_duration_seconds summary"),
        "{text}"
    );
    // Keys are never labels.
    assert!(!text.contains("sku-scraped-7"), "{text}");
    server.stop().await;
}
