//! Idempotency replay: a retry answered from the stored record by lock-tower's
//! `IdempotencyLayer`, one request at a time. On the memory backend against the bare service
//! (overhead = p50 replayed − p50 bare, as the `LockLayer` rows); on Redis against the PING
//! round trip measured in the same rounds (a replay reads the record in one round trip).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt as _, Full};
use lock_core::{Locker, MemoryBackend, RedisBackend};
use lock_tower::IdempotencyLayer;
use tower::{Layer as _, Service, ServiceExt};

use super::Plan;
use crate::server::Target;
use crate::stats::{CommandStats, Latencies, OUR_REQUESTS};
use crate::{BoxError, Result};

const HEADER: &str = "idempotency-key";
/// Distinct keys, each run once before the measured replays cycle over them.
const KEYS: usize = 256;
/// Records of the bench expire soon: a `--redis-url` Redis keeps nothing for a day.
const TTL: Duration = Duration::from_secs(600);

/// Idempotency replay figures.
#[derive(Debug, Clone, Default)]
pub(crate) struct Idempotency {
    /// The bare service, same requests, no layer.
    pub(crate) bare: Latencies,
    pub(crate) memory_replay: Latencies,
    pub(crate) redis_replay: Latencies,
    /// PING, measured in the same rounds as `redis_replay`.
    pub(crate) ping: Latencies,
    /// Requests (round trips) Redis received per replay, by command (commandstats).
    pub(crate) redis_requests: String,
    /// Every command Redis ran per replay, those inside scripts included.
    pub(crate) redis_commands: String,
}

fn request(key: &HeaderValue) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(Bytes::from_static(b"10 EUR")));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = http::Uri::from_static("/payments");
    req.headers_mut().insert(HEADER, key.clone());
    req
}

/// The handler: counts its runs.
fn charge(
    runs: Arc<AtomicUsize>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<String>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_req: Request<Full<Bytes>>| {
        runs.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new("charged 10 EUR".to_owned())) }
    })
}

/// Times `n` sequential requests through `svc`, each answer's body read to its end (the
/// request is built before the clock starts). Returns the latencies and how many answers were
/// replays (`Idempotent-Replayed: true`).
async fn time_requests<S, B>(
    svc: &mut S,
    keys: &[HeaderValue],
    n: usize,
) -> Result<(Latencies, usize)>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::error::Error + Send + Sync + 'static,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let mut out = Latencies::default();
    let replayed = time_into(svc, keys, n, &mut out).await?;
    Ok((out, replayed))
}

/// As [`time_requests`], into `out`; returns the count of replays.
async fn time_into<S, B>(
    svc: &mut S,
    keys: &[HeaderValue],
    n: usize,
    out: &mut Latencies,
) -> Result<usize>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::error::Error + Send + Sync + 'static,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let mut replayed = 0;
    for key in keys.iter().cycle().take(n) {
        let req = request(key);
        let t = Instant::now();
        let svc = svc.ready().await?;
        let response = svc.call(req).await?;
        let (parts, body) = response.into_parts();
        let _body = body.collect().await.map_err(Into::into)?;
        out.record_since(t);
        replayed += usize::from(parts.headers.get("idempotent-replayed").is_some());
    }
    Ok(replayed)
}

fn keys(run: &str) -> Result<Vec<HeaderValue>> {
    let keys = (0..KEYS).map(|i| HeaderValue::from_str(&format!("bench-{run}-{i}")));
    Ok(keys.collect::<std::result::Result<_, _>>()?)
}

/// The layered service, each key already answered once (so every later request is a replay).
async fn primed(
    locker: Locker,
    keys: &[HeaderValue],
) -> Result<(
    impl Service<
        Request<Full<Bytes>>,
        Response = Response<lock_tower::ResponseBody<String>>,
        Error = Infallible,
    >,
    Arc<AtomicUsize>,
)> {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(locker)
        .ttl(TTL)
        .wait(Duration::from_secs(5));
    let mut svc = layer.layer(charge(runs.clone()));
    let (_, replayed) = time_requests(&mut svc, keys, keys.len()).await?;
    if replayed != 0 || runs.load(Ordering::Relaxed) != keys.len() {
        return Err("idempotency: the first request of a key was not run".into());
    }
    Ok((svc, runs))
}

fn check(what: &str, runs: &AtomicUsize, replayed: usize, n: usize) -> Result<()> {
    if replayed != n || runs.load(Ordering::Relaxed) != KEYS {
        let runs = runs.load(Ordering::Relaxed);
        return Err(format!(
            "idempotency ({what}): {replayed} of {n} answers replayed, handler ran {runs} times for {KEYS} keys"
        )
        .into());
    }
    Ok(())
}

pub(crate) async fn idempotency(plan: &Plan, target: &Target) -> Result<Idempotency> {
    let run = format!("{:08x}", getrandom::u32().unwrap_or(0));

    // Memory: bare service, then replays, each after a warm-up of a tenth of `n`.
    let n = plan.layer_n;
    let keys = keys(&run)?;
    let mut bare_svc = charge(Arc::new(AtomicUsize::new(0)));
    time_requests(&mut bare_svc, &keys, n / 10).await?;
    let (bare, _) = time_requests(&mut bare_svc, &keys, n).await?;
    let memory = Locker::builder(MemoryBackend::new()).build();
    let (mut svc, runs) = primed(memory, &keys).await?;
    time_requests(&mut svc, &keys, n / 10).await?;
    let (memory_replay, replayed) = time_requests(&mut svc, &keys, n).await?;
    check("memory", &runs, replayed, n)?;

    // Redis: PING and replays in interleaved rounds, so background load hits both alike.
    let redis = Locker::builder(RedisBackend::connect(&target.url).await?).build();
    let (mut svc, runs) = primed(redis, &keys).await?;
    let conn = target.manager().await?;
    let ping_once = |mut conn: redis::aio::ConnectionManager| async move {
        let t = Instant::now();
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok::<_, BoxError>(t)
    };
    let per = (plan.latency_n / plan.rounds).max(1);
    time_requests(&mut svc, &keys, plan.warmup).await?;
    for _ in 0..plan.warmup {
        ping_once(conn.clone()).await?;
    }
    let mut stats = target.manager().await?;
    let (mut ping, mut redis_replay) = (Latencies::default(), Latencies::default());
    let mut commands = CommandStats::default();
    let mut replayed = 0;
    for _ in 0..plan.rounds {
        for _ in 0..per {
            let t = ping_once(conn.clone()).await?;
            ping.record_since(t);
        }
        let before = CommandStats::fetch(&mut stats).await?;
        replayed += time_into(&mut svc, &keys, per, &mut redis_replay).await?;
        commands = commands.plus(&CommandStats::fetch(&mut stats).await?.since(&before));
    }
    let n = per * plan.rounds;
    check("Redis", &runs, replayed, n)?;
    let per = u64::try_from(n).unwrap_or(u64::MAX);
    let redis_requests = commands.breakdown(per, OUR_REQUESTS);
    let redis_commands = commands.breakdown(per, &commands.names());
    Ok(Idempotency {
        bare,
        memory_replay,
        redis_replay,
        ping,
        redis_requests,
        redis_commands,
    })
}
