//! TLS to Redis (lock-core's `tls` feature) against real redis-server processes listening
//! with `--tls-port` and certificates the test kit makes (an authority, a server certificate
//! for 127.0.0.1, a client certificate, an unrelated authority): a lock over TLS kept across a
//! `CLIENT KILL` (the reconnections are TLS ones too), mutual TLS (`--tls-auth-clients yes`:
//! refused without a client certificate, served with one), a server certificate from an
//! authority the client does not trust refused with a typed error naming the certificate
//! within the connect timeout, certificates given with a `redis://` URL or as bad PEM refused
//! as configuration errors, a handshake never answered failing within two connect timeouts,
//! and Sentinel, Cluster and Redlock over TLS.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a test file: its helpers assert by panicking; the refusals are printed for the notes"
)]

use std::time::{Duration, Instant};

use lock_core::{
    LockError, Locker, RedisBackend, RedisClusterBackend, RedisSentinelBackend, RedlockBackend,
};
use lock_testkit::cluster::RedisCluster;
use lock_testkit::sentinel::RedisSentinelSet;
use lock_testkit::{RedisServer, TlsCerts, eventually};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A hang guard for what should happen soon; never a speed claim.
const SOON: Duration = Duration::from_secs(10);

fn tls_server(certs: &TlsCerts) -> RedisServer {
    RedisServer::builder().tls(certs).start()
}

/// How many client connections the server has on its TLS port (the `laddr` of `CLIENT
/// LIST`; the kit's helpers use the plain port).
async fn tls_clients(server: &RedisServer) -> usize {
    let tls_port = server.tls_port().unwrap().to_string();
    let list: String = server.query(redis::cmd("CLIENT").arg("LIST").clone()).await;
    list.lines()
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("laddr=")))
        .filter(|laddr| {
            laddr
                .rsplit_once(':')
                .is_some_and(|(_, port)| port == tls_port)
        })
        .count()
}

/// The error's whole text: its message and every source's.
fn chain(e: &LockError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(" / ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Asserts that `connect` fails with a backend error about the TLS connection whose text
/// names a certificate, within the connect timeout (and a margin for the probe's bound).
async fn assert_refused<T: std::fmt::Debug>(
    connect: impl Future<Output = Result<T, LockError>>,
    what: &str,
) {
    let started = Instant::now();
    let e = connect.await.expect_err(what);
    let took = started.elapsed();
    let text = chain(&e);
    assert!(
        matches!(e, LockError::Backend { .. }),
        "{what}: not a backend error: {text}"
    );
    assert!(
        text.contains("TLS"),
        "{what}: the error does not say TLS: {text}"
    );
    assert!(
        text.to_ascii_lowercase().contains("certificate"),
        "{what}: the error does not name a certificate: {text}"
    );
    assert!(
        took < CONNECT_TIMEOUT * 2,
        "{what}: refused after {took:?}, past the connect timeout {CONNECT_TIMEOUT:?}"
    );
    println!("{what}: refused in {took:?}: {e}");
}

/// A fenced lock over TLS: held, its connections killed (`CLIENT KILL`), checked and renewed
/// over new TLS connections, released; then taken again. Every connection the backend opened,
/// after the kill, is on the TLS port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_over_tls_is_kept_across_a_client_kill() {
    let certs = TlsCerts::generate();
    let server = tls_server(&certs);
    let backend = RedisBackend::builder(&server.tls_url())
        .tls(&certs.ca_pem())
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .expect("connect over TLS");
    let lease = Duration::from_secs(30);
    let locker = Locker::builder(backend).lease(lease).build();
    let guard = locker
        .lock("tls:kept")
        .fenced()
        .await
        .expect("lock over TLS");
    let first = guard.fence().expect("fenced");
    assert!(tls_clients(&server).await >= 1);
    // Let the lease age, so the renewal after the kill shows in its TTL.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let aged = server.pttl("lock:{tls:kept}").await;
    assert!(server.client_kill_all().await >= 1);
    eventually("the lease renewed after the kill", SOON, async || {
        server.pttl("lock:{tls:kept}").await > aged + 1_000
    })
    .await;
    assert!(guard.is_held());
    // Every connection was killed: these are the backend's reconnections, over TLS.
    assert!(
        tls_clients(&server).await >= 1,
        "reconnected on the TLS port"
    );
    guard.release().await.expect("released over TLS");
    assert!(!server.exists("lock:{tls:kept}").await);
    let again = locker
        .lock("tls:kept")
        .fenced()
        .await
        .expect("locked again");
    assert!(again.fence().expect("fenced") > first);
    again.release().await.unwrap();
}

/// `Locker::redis` with a `rediss://` URL alone trusts the public roots: the kit's private
/// authority is not one of them, so the server is refused with a typed error naming the
/// certificate; a client that trusts only an unrelated authority is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_untrusted_authority_is_refused() {
    let certs = TlsCerts::generate();
    let server = tls_server(&certs);
    assert_refused(
        RedisBackend::builder(&server.tls_url())
            .tls(&certs.other_ca_pem())
            .connect_timeout(CONNECT_TIMEOUT)
            .connect(),
        "trusting another authority",
    )
    .await;
    assert_refused(
        RedisBackend::builder(&server.tls_url())
            .connect_timeout(CONNECT_TIMEOUT)
            .connect(),
        "trusting the public roots",
    )
    .await;
    // The same server is served once its authority is trusted.
    let backend = RedisBackend::builder(&server.tls_url())
        .tls(&certs.ca_pem())
        .connect()
        .await
        .expect("the right authority");
    Locker::builder(backend)
        .build()
        .lock("tls:ok")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A server that asks clients for a certificate (`--tls-auth-clients yes`) refuses a client
/// without one (a typed error naming the certificate, within the connect timeout) and serves
/// one that presents the kit's client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = TlsCerts::generate();
    let server = RedisServer::builder()
        .tls(&certs)
        .tls_auth_clients()
        .start();
    assert_refused(
        RedisBackend::builder(&server.tls_url())
            .tls(&certs.ca_pem())
            .connect_timeout(CONNECT_TIMEOUT)
            .connect(),
        "no client certificate",
    )
    .await;
    let backend = RedisBackend::builder(&server.tls_url())
        .tls(&certs.ca_pem())
        .tls_identity(&certs.client_cert_pem(), &certs.client_key_pem())
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .expect("connect with the client certificate");
    let locker = Locker::builder(backend).build();
    let guard = locker
        .lock("tls:mutual")
        .await
        .expect("lock over mutual TLS");
    assert!(server.exists("lock:{tls:mutual}").await);
    guard.release().await.unwrap();
    assert!(!server.exists("lock:{tls:mutual}").await);
}

/// Certificates given with a `redis://` URL (to any of the four builders), or PEM that is not
/// a certificate, are configuration errors, before any connection.
#[tokio::test(flavor = "current_thread")]
async fn tls_settings_that_cannot_apply_are_configuration_errors() {
    let certs = TlsCerts::generate();
    let plain = RedisBackend::builder("redis://127.0.0.1:1/")
        .tls(&certs.ca_pem())
        .connect()
        .await;
    match plain {
        Err(LockError::InvalidConfig { what, .. }) => assert!(what.contains("rediss://"), "{what}"),
        other => panic!("certificates with redis:// accepted: {other:?}"),
    }
    let garbage = RedisBackend::builder("rediss://127.0.0.1:1/")
        .tls(b"not a certificate")
        .connect()
        .await;
    assert!(
        matches!(garbage, Err(LockError::InvalidConfig { .. })),
        "{garbage:?}"
    );
    let key = RedisBackend::builder("rediss://127.0.0.1:1/")
        .tls(&certs.ca_pem())
        .tls_identity(&certs.client_cert_pem(), b"not a key")
        .connect()
        .await;
    assert!(
        matches!(key, Err(LockError::InvalidConfig { .. })),
        "{key:?}"
    );
    let cluster = RedisClusterBackend::builder(&["redis://127.0.0.1:1/"])
        .tls(&certs.ca_pem())
        .connect()
        .await;
    assert!(
        matches!(cluster, Err(LockError::InvalidConfig { .. })),
        "{cluster:?}"
    );
    let redlock = RedlockBackend::builder(&["redis://127.0.0.1:1/"])
        .tls(&certs.ca_pem())
        .connect()
        .await;
    assert!(
        matches!(redlock, Err(LockError::InvalidConfig { .. })),
        "{redlock:?}"
    );
    let sentinel = RedisSentinelBackend::builder(&["redis://127.0.0.1:1/"], "mymaster")
        .tls(&certs.ca_pem())
        .connect()
        .await;
    assert!(
        matches!(sentinel, Err(LockError::InvalidConfig { .. })),
        "{sentinel:?}"
    );
}

/// A Sentinel set over TLS (servers, replication and sentinels): a client that trusts another
/// authority is refused with a typed error naming the certificate; one that trusts the set's
/// asks the sentinels over TLS, reaches the primary they name on its TLS port (presenting the
/// client certificate to both), locks and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_locks_and_releases() {
    let certs = TlsCerts::generate();
    let set = RedisSentinelSet::builder()
        .replicas(1)
        .tls(&certs)
        .start()
        .await;
    let urls = set.sentinel_tls_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    assert_refused(
        RedisSentinelBackend::builder(&urls, set.master_name())
            .tls(&certs.other_ca_pem())
            .connect_timeout(CONNECT_TIMEOUT)
            .connect(),
        "sentinels of an untrusted authority",
    )
    .await;
    let backend = RedisSentinelBackend::builder(&urls, set.master_name())
        .tls(&certs.ca_pem())
        .tls_identity(&certs.client_cert_pem(), &certs.client_key_pem())
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .expect("connect through the sentinels over TLS");
    let primary_tls = set.primary().tls_port().unwrap();
    assert_eq!(backend.primary(), format!("127.0.0.1:{primary_tls}"));
    let locker = Locker::builder(backend).build();
    let guard = locker.lock("tls:sentinel").fenced().await.expect("lock");
    assert!(set.primary().exists("lock:{tls:sentinel}").await);
    assert!(locker.try_lock("tls:sentinel").await.is_err(), "held");
    guard.release().await.expect("release");
    assert!(!set.primary().exists("lock:{tls:sentinel}").await);
}

/// A cluster over TLS (client connections, cluster bus and replication): a client that trusts
/// another authority is refused with a typed error naming the certificate; locks on every shard
/// are taken, renewed and released through the slot map the nodes give over TLS (their TLS
/// ports), with every primary reached on its TLS port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_locks_and_releases() {
    let certs = TlsCerts::generate();
    let cluster = RedisCluster::builder()
        .replicas_per_primary(0)
        .tls(&certs)
        .start()
        .await;
    let urls = cluster.tls_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    assert_refused(
        RedisClusterBackend::builder(&urls)
            .tls(&certs.other_ca_pem())
            .connect_timeout(CONNECT_TIMEOUT)
            .connect(),
        "nodes of an untrusted authority",
    )
    .await;
    let backend = RedisClusterBackend::builder(&urls[..1])
        .tls(&certs.ca_pem())
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .expect("connect to the cluster over TLS");
    let locker = Locker::builder(backend)
        .lease(Duration::from_secs(3))
        .build();
    let keys: Vec<String> = (0..12).map(|i| format!("tls:spread-{i}")).collect();
    let mut shards = std::collections::HashSet::new();
    for k in &keys {
        shards.insert(cluster.primary_for_key(&format!("lock:{{{k}}}")).await);
    }
    assert_eq!(shards.len(), 3, "the keys cover every shard");
    let mut guards = Vec::new();
    for k in &keys {
        guards.push(locker.lock(k).fenced().await.expect("lock on the cluster"));
        let name = format!("lock:{{{k}}}");
        let primary = cluster.primary_for_key(&name).await;
        assert!(cluster.node(primary).server().exists(&name).await, "{name}");
    }
    // Past a renewal (lease/3): the watchdog renews through each primary's own connection.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for g in &guards {
        assert!(g.is_held(), "{} still held", g.key());
    }
    for g in guards {
        g.release().await.expect("release");
    }
    for (i, node) in cluster.nodes().iter().enumerate() {
        // The backend reached every primary at the TLS port the slot map named.
        assert!(
            tls_clients(node.server()).await >= 1,
            "node {i}: no connection on its TLS port"
        );
    }
    for k in &keys {
        let name = format!("lock:{{{k}}}");
        let primary = cluster.primary_for_key(&name).await;
        assert!(
            !cluster.node(primary).server().exists(&name).await,
            "{name}"
        );
    }
}

/// Redlock over three TLS servers that ask for client certificates: the lock is written on
/// every server and released from every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls_locks_and_releases() {
    let certs = TlsCerts::generate();
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::builder()
                .tls(&certs)
                .tls_auth_clients()
                .start()
        })
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::tls_url).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedlockBackend::builder(&urls)
        .tls(&certs.ca_pem())
        .tls_identity(&certs.client_cert_pem(), &certs.client_key_pem())
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .expect("connect to the Redlock servers over TLS");
    let locker = Locker::builder(backend).build();
    let guard = locker
        .lock("tls:redlock")
        .await
        .expect("lock on a majority");
    // The lock is decided by the first two answers of three: the third server's write may
    // still be on its way.
    for server in &servers {
        eventually("the lock on every server", SOON, async || {
            server.exists("lock:{tls:redlock}").await
        })
        .await;
        assert!(tls_clients(server).await >= 1);
    }
    guard.release().await.expect("release");
    for server in &servers {
        assert!(!server.exists("lock:{tls:redlock}").await);
    }
}

/// A server that accepts the connection but never answers the TLS handshake (a stalled
/// server) fails `connect` with a backend error, never a hang: each attempt is bounded by the
/// connect timeout, and the connection manager makes two (one retry, as for a plain
/// connection; `manager_config`), so within twice the connect timeout and a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_never_answered_fails_within_the_connect_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts and holds every connection, reading nothing, answering nothing.
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let certs = TlsCerts::generate();
    let started = Instant::now();
    let result = RedisBackend::builder(&format!("rediss://127.0.0.1:{port}/"))
        .tls(&certs.ca_pem())
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(LockError::Backend { .. })),
        "{result:?}"
    );
    assert!(
        took < CONNECT_TIMEOUT * 2 + Duration::from_millis(500),
        "failed after {took:?}, past two attempts of the connect timeout {CONNECT_TIMEOUT:?}"
    );
    println!("an unanswered handshake failed in {took:?}");
    held.abort();
}
