//! What users stack on a locker, on each engine that spans several Redis processes (Redlock
//! over 3 independent servers, a Redis Cluster of 3 shards, a Sentinel-watched primary):
//! `#[distributed_lock]` serializes an annotated function called from many tasks of two
//! lockers, and lock-tower's `LockLayer` and `IdempotencyLayer` serialize requests per key and
//! answer a retried request with the first answer, across two apps on two lockers. With the
//! `etcd` feature, the same on one etcd member; with the `zookeeper` feature, on a standalone
//! ZooKeeper server.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers assert by panicking"
)]

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use http_body_util::BodyExt;
use lock_core::{LockError, Locker, distributed_lock};
use lock_testkit::RedisServer;
use lock_testkit::cluster::RedisCluster;
use lock_testkit::sentinel::RedisSentinelSet;
use lock_tower::{HeaderKey, IdempotencyLayer, LockLayer};
use tower::ServiceExt;

/// The processes of a deployment (killed when dropped) and two lockers on it (two processes'
/// worth of clients).
type Deployment = (Box<dyn Any + Send>, Locker, Locker);

async fn redlock() -> Deployment {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = Locker::redlock(&urls).await.expect("connect");
    let b = Locker::redlock(&urls).await.expect("connect");
    (Box::new(servers), a, b)
}

async fn cluster() -> Deployment {
    let cluster = RedisCluster::start().await;
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = Locker::redis_cluster(&urls).await.expect("connect");
    let b = Locker::redis_cluster(&urls).await.expect("connect");
    (Box::new(cluster), a, b)
}

async fn sentinel() -> Deployment {
    let set = RedisSentinelSet::start().await;
    let urls = set.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = Locker::redis_sentinel(&urls, set.master_name())
        .await
        .expect("connect");
    let b = Locker::redis_sentinel(&urls, set.master_name())
        .await
        .expect("connect");
    (Box::new(set), a, b)
}

/// Counts how many run at once inside.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
    runs: AtomicUsize,
}

impl Inside {
    async fn run(&self) {
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(n, SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.runs.fetch_add(1, SeqCst);
        self.now.fetch_sub(1, SeqCst);
    }
}

#[distributed_lock(key = "item:{id}", locker = locker, wait = "30s")]
async fn bump(locker: &Locker, id: u32, inside: &Inside) -> Result<(), LockError> {
    inside.run().await;
    Ok(())
}

async fn the_macro_serializes_calls_across_lockers((_processes, a, b): Deployment) {
    let inside = Arc::new(Inside::default());
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let locker = if t % 2 == 0 { a.clone() } else { b.clone() };
            let inside = inside.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    bump(&locker, 7, &inside).await.expect("bump");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(inside.runs.load(SeqCst), 80);
    assert_eq!(inside.most.load(SeqCst), 1, "two bodies ran at once");
}

async fn lock_tower_serializes_per_key_and_replays_a_retry_across_two_apps(
    (_processes, a, b): Deployment,
) {
    let inside = Arc::new(Inside::default());
    let app = |locker: Locker| {
        let inside = inside.clone();
        axum::Router::new()
            .route(
                "/pay",
                axum::routing::post(move || {
                    let inside = inside.clone();
                    async move {
                        inside.run().await;
                        format!("paid #{}", inside.runs.load(SeqCst))
                    }
                }),
            )
            .layer(IdempotencyLayer::new(locker.clone()).wait(Duration::from_secs(30)))
            .layer(LockLayer::new(locker, HeaderKey::new("x-resource")))
    };
    let (app_a, app_b) = (app(a), app(b));
    let request = |key: String| {
        http::Request::post("/pay")
            .header("x-resource", "order-1")
            .header("idempotency-key", key)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    // Distinct requests on one resource, through both apps at once: one at a time.
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let app = if i % 2 == 0 {
                app_a.clone()
            } else {
                app_b.clone()
            };
            let request = request(format!("distinct-{i}"));
            tokio::spawn(async move { app.oneshot(request).await.unwrap().status() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.expect("task"), 200);
    }
    assert_eq!(inside.runs.load(SeqCst), 12);
    assert_eq!(inside.most.load(SeqCst), 1, "two handlers ran at once");
    // A retry through the other app gets the first answer; the handler does not run again.
    let first = app_a
        .clone()
        .oneshot(request("retry".into()))
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let first_body = first.into_body().collect().await.unwrap().to_bytes();
    let retry = app_b.oneshot(request("retry".into())).await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let retry_body = retry.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(retry_body, first_body, "the retry got the first answer");
    assert_eq!(
        inside.runs.load(SeqCst),
        13,
        "the handler ran once for the retried key"
    );
}

/// Both checks on each engine.
macro_rules! on {
    ($($engine:ident),*) => {
        mod macro_serializes {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $engine() {
                    the_macro_serializes_calls_across_lockers(super::$engine().await).await;
                }
            )*
        }
        mod tower_serializes_and_replays {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $engine() {
                    lock_tower_serializes_per_key_and_replays_a_retry_across_two_apps(
                        super::$engine().await,
                    )
                    .await;
                }
            )*
        }
    };
}

on!(redlock, cluster, sentinel);

/// The same checks on etcd (feature `etcd`): one member of the test kit's etcd cluster.
#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use lock_testkit::etcd::EtcdCluster;

    async fn etcd() -> Deployment {
        let cluster = EtcdCluster::start_single().await;
        let urls = cluster.urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let a = Locker::etcd(&urls).await.expect("connect");
        let b = Locker::etcd(&urls).await.expect("connect");
        (Box::new(cluster), a, b)
    }

    on!(etcd);
}

/// The same checks on ZooKeeper (feature `zookeeper`): a standalone server of the test kit,
/// each locker with its own session and the default options (a 40 s session, 30 s leases).
#[cfg(feature = "zookeeper")]
mod zookeeper {
    use super::*;
    use lock_testkit::zookeeper::ZooKeeperEnsemble;

    async fn zookeeper() -> Deployment {
        let ensemble = ZooKeeperEnsemble::start_single().await;
        let hosts = ensemble.connect_string();
        let a = Locker::zookeeper(&hosts).await.expect("connect");
        let b = Locker::zookeeper(&hosts).await.expect("connect");
        (Box::new(ensemble), a, b)
    }

    on!(zookeeper);
}
