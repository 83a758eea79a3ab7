//! etcd: our lock on one etcd member the bench starts (the test kit's `EtcdCluster`, one
//! member on free loopback ports, data on tmpfs), against etcd's own floors measured in the
//! same run by a gRPC client in this process (the `etcd-client` crate lock-core uses, with
//! lock-core's connection options):
//! - uncontended lock + release against a linearizable `Range` (a `Put`, one Raft write, as
//!   context), in interleaved rounds;
//! - a contended handoff between two `Locker`s (the holder's release call → the waiter's lock
//!   returned) against the floor of a watch event (a `Put` call → a watcher on another client
//!   has the event), in interleaved chunks;
//! - the watchdog's traffic for 1,000 locks held on one `Locker`: requests per tick by gRPC
//!   method, read from etcd's own Prometheus `/metrics` (`grpc_server_msg_received_total`)
//!   before and after the window, and the bytes on the wire, counted by a test-kit proxy the
//!   `Locker` talks through.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, EventType, WatchOptions, WatchStream};
use lock_core::{EtcdBackend, Locker};
use lock_testkit::etcd::{EtcdCluster, find_etcd};
use lock_testkit::proxy::Proxy;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

use super::consensus::{handoff_chunks, held_window, interleaved_rounds};
use super::{Plan, random_between};
use crate::Result;
use crate::stats::Latencies;

/// The lease of the latency scenarios (long enough never to matter).
const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(15);
/// Keys cycled through by the uncontended loop.
const KEYS: usize = 16;
/// The lock of the handoff scenario.
const HANDOFF_KEY: &str = "etcd-handoff";
/// The key the watch-event floor puts and watches.
const FLOOR_KEY: &str = "bench:watch-floor";

/// Everything the etcd section measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Etcd {
    /// `etcd_server_version` from the member's metrics.
    pub(crate) version: String,
    /// A linearizable `Range` of one key (the floor).
    pub(crate) range: Latencies,
    /// A `Put` of one key (context: one Raft write).
    pub(crate) put: Latencies,
    /// Uncontended lock + release.
    pub(crate) cycle: Latencies,
    /// `LockerStats::backend_calls` per uncontended cycle.
    pub(crate) cycle_calls: f64,
    /// The holder's release call → the waiter on another `Locker` has the lock.
    pub(crate) handoff: Latencies,
    /// The waiter's `LockerStats::backend_calls` per handoff (its lock and its release).
    pub(crate) handoff_calls: f64,
    /// A `Put` call → a watcher on another client has the event (the floor).
    pub(crate) watch_event: Latencies,
    pub(crate) watchdog: EtcdWatchdog,
}

/// The watchdog's traffic while `locks` locks are held on one `Locker`.
#[derive(Debug, Clone, Default)]
pub(crate) struct EtcdWatchdog {
    pub(crate) locks: usize,
    pub(crate) lease: Duration,
    pub(crate) window: Duration,
    /// Renewal calls the `Locker` made in the window (`LockerStats::renewal_calls`).
    pub(crate) renewal_calls: u64,
    /// Requests etcd received in the window, by gRPC method (stream messages counted one by
    /// one: each keepalive is one `LeaseKeepAlive` message).
    pub(crate) requests: BTreeMap<String, u64>,
    /// Protobuf bytes etcd counted in the window (`etcd_network_client_grpc_received_bytes_total`,
    /// `..._sent_bytes_total`): every client's, the message bodies only.
    pub(crate) payload: (u64, u64),
    /// TCP bytes between the `Locker` and etcd in the window (HTTP/2 framing included):
    /// `(to etcd, from etcd)`.
    pub(crate) wire: (u64, u64),
}

impl EtcdWatchdog {
    /// The watchdog's period: a third of the lease.
    pub(crate) fn tick(&self) -> Duration {
        self.lease / 3
    }

    /// How many ticks the window holds.
    pub(crate) fn ticks(&self) -> f64 {
        self.window.as_secs_f64() / self.tick().as_secs_f64()
    }

    pub(crate) fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
}

/// lock-core's connection options for etcd (`EtcdBackendBuilder::connect`, default timeouts):
/// the floors are measured with the client the lock uses, configured as it configures it.
fn connect_options() -> ConnectOptions {
    let timeout = Duration::from_secs(2);
    ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout)
        .with_require_leader(true)
        .with_keep_alive(Duration::from_secs(10), timeout)
}

async fn raw_client(url: &str) -> Result<Client> {
    Ok(Client::connect([url], Some(connect_options())).await?)
}

async fn locker(url: &str, lease: Duration) -> Result<Locker> {
    let backend = EtcdBackend::connect(&[url]).await?;
    Ok(Locker::builder(backend).lease(lease).build())
}

/// Runs the etcd section on one member the bench starts.
pub(crate) async fn etcd(plan: &Plan) -> Result<Etcd> {
    // The kit panics when etcd is missing; a CLI says so and exits instead.
    find_etcd()?;
    let cluster = EtcdCluster::start_single().await;
    let url = cluster.client_url(0);
    let addr = cluster.client_addr(0);
    let version = Metrics::fetch(addr).await?.version;
    crate::progress(&format!("  etcd {version} at {url}"));
    let mut figures = uncontended(plan, &url).await?;
    handoff(plan, &url, &mut figures).await?;
    figures.watchdog = watchdog(plan, addr).await?;
    figures.version = version;
    Ok(figures)
}

/// Range, Put and lock + release, in `plan.rounds` interleaved rounds after a warm-up round.
async fn uncontended(plan: &Plan, url: &str) -> Result<Etcd> {
    crate::progress("  uncontended lock + release against Range and Put");
    let mut raw = raw_client(url).await?;
    raw.put("bench:range", "x", None).await?;
    let locker = locker(url, LEASE).await?;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("uc:{i}")).collect();
    // A clone shares the client's connection: both floors go over it, as before.
    let mut writer = raw.clone();
    let read = async || Ok(raw.get("bench:range", None).await?);
    let write = async || Ok(writer.put("bench:put", "x", None).await?);
    let n = plan.etcd_latency_n;
    let ([range, put, cycle], cycle_calls) =
        interleaved_rounds(plan, n, &locker, &keys, read, write).await?;
    Ok(Etcd {
        range,
        put,
        cycle,
        cycle_calls,
        ..Etcd::default()
    })
}

/// The handoff between two lockers and the watch-event floor, in `CHUNKS` interleaved chunks.
async fn handoff(plan: &Plan, url: &str, figures: &mut Etcd) -> Result<()> {
    crate::progress("  handoff between two lockers against a watch event");
    let (a, b) = (locker(url, LEASE).await?, locker(url, LEASE).await?);
    let mut raw = raw_client(url).await?;
    // The observer of the handoff's queue: tells when the waiter's key exists.
    let prefix = format!("{}{{{HANDOFF_KEY}}}/q/", lock_core::DEFAULT_PREFIX);
    let mut queue = created(&mut raw_client(url).await?, prefix, true).await?;
    // The floor's watcher, on a client of its own (as the waiter's locker has its own).
    let mut floor_events = floor_watcher(url).await?;
    let handoff = async || handoff_once(plan, &a, &b, &mut queue).await;
    let event = async || {
        tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
        let t = Instant::now();
        raw.put(FLOOR_KEY, "x", None).await?;
        let heard = floor_events.recv().await;
        let heard = heard.ok_or("etcd: the floor's watch stream ended")?;
        Ok(heard.saturating_duration_since(t))
    };
    let n = plan.etcd_handoff_n;
    let (handoffs, events, calls) = handoff_chunks(plan, n, &b, handoff, event).await?;
    (figures.handoff, figures.watch_event) = (handoffs, events);
    figures.handoff_calls = calls;
    Ok(())
}

/// One handoff: A holds the lock, B starts waiting on it; once B's key is in etcd and a random
/// hold has passed, A releases. The sample is A's release call → B's lock returned.
async fn handoff_once(
    plan: &Plan,
    a: &Locker,
    b: &Locker,
    queue: &mut WatchStream,
) -> Result<Duration> {
    let held = a.lock(HANDOFF_KEY).await?;
    let waiter = b.clone();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock(HANDOFF_KEY).wait(WAIT).await;
        (Instant::now(), guard)
    });
    // A's key, then B's: the queue's events come in revision order, after the deletes of the
    // previous handoff.
    let mut puts = 0;
    while puts < 2 {
        let answer = queue.message().await?;
        let answer = answer.ok_or("etcd: the queue's watch stream ended")?;
        let events = answer.events().iter();
        puts += events.filter(|e| e.event_type() == EventType::Put).count();
    }
    // B is between its key's creation and its watch of A's key; the hold lets it get there,
    // as a waiter of a real lock usually has.
    tokio::time::sleep(random_between(plan.hold.0, plan.hold.1)).await;
    let t = Instant::now();
    held.release().await?;
    let (at, guard) = waiting.await?;
    guard?.release().await?;
    Ok(at.saturating_duration_since(t))
}

/// A watch of `key` (a prefix when `prefix`) once etcd has confirmed it.
async fn created(client: &mut Client, key: String, prefix: bool) -> Result<WatchStream> {
    let options = WatchOptions::new();
    let options = if prefix {
        options.with_prefix()
    } else {
        options
    };
    let mut stream = client.watch(key, Some(options)).await?;
    loop {
        let answer = stream
            .message()
            .await?
            .ok_or("etcd: a watch ended at once")?;
        if answer.created() {
            return Ok(stream);
        }
    }
}

/// A task watching `FLOOR_KEY` on a client of its own, sending the instant each event came.
async fn floor_watcher(url: &str) -> Result<mpsc::UnboundedReceiver<Instant>> {
    let mut client = raw_client(url).await?;
    let mut stream = created(&mut client, FLOOR_KEY.to_owned(), false).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _client = client;
        while let Ok(Some(answer)) = stream.message().await {
            let at = Instant::now();
            for _ in answer.events() {
                if tx.send(at).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// 1,000 locks held on one `Locker` (through a counting proxy) while the watchdog renews
/// them; etcd's request counters and the proxy's bytes over whole ticks.
async fn watchdog(plan: &Plan, addr: SocketAddr) -> Result<EtcdWatchdog> {
    let n = plan.watchdog_locks;
    let lease = plan.watchdog_lease.max(lock_core::ETCD_MIN_LEASE);
    crate::progress(&format!("  watchdog: {n} locks, lease {lease:?}"));
    let proxy = Proxy::start(addr).await;
    let locker = locker(&format!("http://{}", proxy.addr()), lease).await?;
    let window = held_window(plan, &locker, &proxy, "etcd watchdog", async || {
        Metrics::fetch(addr).await
    })
    .await?;
    let (before, after) = (&window.before, &window.after);
    let requests = after
        .received
        .iter()
        .map(|(method, &count)| {
            let was = before.received.get(method).copied().unwrap_or(0);
            (method.clone(), count.saturating_sub(was))
        })
        .filter(|(_, count)| *count > 0)
        .collect();
    Ok(EtcdWatchdog {
        locks: n,
        lease,
        window: plan.watchdog_window,
        renewal_calls: window.renewal_calls,
        requests,
        payload: (
            after.payload.0.saturating_sub(before.payload.0),
            after.payload.1.saturating_sub(before.payload.1),
        ),
        wire: window.wire,
    })
}

/// What the bench reads from etcd's Prometheus `/metrics`.
#[derive(Debug, Default)]
struct Metrics {
    version: String,
    /// `grpc_server_msg_received_total` by `grpc_method`.
    received: BTreeMap<String, u64>,
    /// `etcd_network_client_grpc_received_bytes_total`, `..._sent_bytes_total`.
    payload: (u64, u64),
}

impl Metrics {
    /// One `GET /metrics` on the member's client port (HTTP/1.0: the body ends with the
    /// connection).
    async fn fetch(addr: SocketAddr) -> Result<Self> {
        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        conn.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        let read = conn.read_to_end(&mut response);
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .map_err(|_| "etcd: /metrics did not answer within 10 s")??;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
            let status = head.lines().next().unwrap_or_default();
            return Err(format!("etcd: GET /metrics answered `{status}`").into());
        }
        Ok(Self::parse(body))
    }

    fn parse(text: &str) -> Self {
        let mut m = Metrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            // Counters are printed as floats (`1.5e+06` for large ones).
            let value = value.parse::<f64>().map_or(0, |v| v as u64);
            let label = |name: &str| {
                let (_, rest) = series.split_once(&format!("{name}=\""))?;
                Some(rest.split_once('"')?.0.to_owned())
            };
            match series.split_once('{').map_or(series, |(name, _)| name) {
                "grpc_server_msg_received_total" => {
                    if let Some(method) = label("grpc_method") {
                        *m.received.entry(method).or_default() += value;
                    }
                }
                "etcd_network_client_grpc_received_bytes_total" => m.payload.0 = value,
                "etcd_network_client_grpc_sent_bytes_total" => m.payload.1 = value,
                "etcd_server_version" => {
                    m.version = label("server_version").unwrap_or_default();
                }
                _ => {}
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_request_counters_bytes_and_version_from_metrics() {
        let text = "\
# HELP grpc_server_msg_received_total Total number of RPC stream messages received on the server.
grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 16
grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 2
etcd_network_client_grpc_received_bytes_total 1.234567e+06
etcd_network_client_grpc_sent_bytes_total 72
etcd_server_version{server_version=\"3.4.23\"} 1
";
        let m = super::Metrics::parse(text);
        assert_eq!(m.version, "3.4.23");
        assert_eq!(m.received["Txn"], 16);
        assert_eq!(m.received["LeaseKeepAlive"], 2);
        assert_eq!(m.payload, (1_234_567, 72));
    }
}
