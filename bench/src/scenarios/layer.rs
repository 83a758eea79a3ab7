//! Layer overhead: lock-tower's `LockLayer` around an echo service versus the bare echo
//! service, one request at a time, the key taken from a header. Overhead = p50 layered − p50
//! bare. On the memory backend for distinct keys and for one hot key, and on Redis for distinct
//! keys, interleaved key by key with the same locker's bare lock + release on the same key and
//! a PING (what the layer adds to the lock's own two round trips).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::{HeaderValue, Request, Response};
use lock_core::{Locker, MemoryBackend, RedisBackend};
use lock_tower::LockLayer;
use lock_tower::extract::HeaderKey;
use tower::{Layer as _, Service, ServiceExt};

use super::{Op, Plan};
use crate::Result;
use crate::server::Target;
use crate::stats::{CommandStats, Latencies};

const HEADER: &str = "x-lock-key";
/// Distinct keys cycled through (more than the memory backend keeps before sweeping).
const DISTINCT: usize = 4096;
const WAIT: Duration = Duration::from_secs(5);

/// Layer overhead figures.
#[derive(Debug, Clone, Default)]
pub(crate) struct Layer {
    pub(crate) bare: Latencies,
    pub(crate) memory_distinct: Latencies,
    pub(crate) memory_hot: Latencies,
    pub(crate) redis_distinct: Latencies,
    /// PING and the same locker's lock + release on the same keys, in the same rounds.
    pub(crate) redis_ping: Latencies,
    pub(crate) redis_cycle: Latencies,
    /// Requests (round trips) Redis received per layered request, by command (commandstats).
    pub(crate) redis_requests: String,
}

fn request(key: &HeaderValue) -> Request<String> {
    let mut req = Request::new(String::new());
    req.headers_mut().insert(HEADER, key.clone());
    req
}

/// Times `n` sequential requests through `svc` (the request is built before the clock starts).
async fn time_requests<S>(svc: &mut S, keys: &[HeaderValue], n: usize) -> Result<Latencies>
where
    S: Service<Request<String>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let mut out = Latencies::default();
    time_into(svc, keys, n, &mut out).await?;
    Ok(out)
}

async fn time_into<S>(
    svc: &mut S,
    keys: &[HeaderValue],
    n: usize,
    out: &mut Latencies,
) -> Result<()>
where
    S: Service<Request<String>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    for key in keys.iter().cycle().take(n) {
        let req = request(key);
        let t = Instant::now();
        let svc = svc.ready().await?;
        let _response = svc.call(req).await?;
        out.record_since(t);
    }
    Ok(())
}

fn echo()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    })
}

/// Measures `svc` after a warm-up of a tenth of `n`.
async fn measure<S>(mut svc: S, keys: &[HeaderValue], n: usize) -> Result<Latencies>
where
    S: Service<Request<String>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    time_requests(&mut svc, keys, n / 10).await?;
    time_requests(&mut svc, keys, n).await
}

pub(crate) async fn layer(plan: &Plan, target: &Target) -> Result<Layer> {
    let n = plan.layer_n;
    let distinct: Vec<HeaderValue> = (0..DISTINCT)
        .map(|i| HeaderValue::from_str(&format!("order:{i}")))
        .collect::<std::result::Result<_, _>>()?;
    let hot = [HeaderValue::from_static("order:hot")];
    let layer = |locker: Locker| LockLayer::new(locker, HeaderKey::new(HEADER)).wait(WAIT);

    let bare = measure(echo(), &distinct, n).await?;
    let memory = Locker::builder(MemoryBackend::new()).build();
    let memory_distinct = measure(layer(memory.clone()).layer(echo()), &distinct, n).await?;
    let memory_hot = measure(layer(memory).layer(echo()), &hot, n).await?;
    let redis = Locker::builder(RedisBackend::connect(&target.url).await?).build();
    let mut svc = layer(redis.clone()).layer(echo());
    let ping = Op::Ping(target.manager().await?);
    let n = plan.latency_n;
    // The warm-up, between two commandstats snapshots: the requests a layered request sends.
    let mut stats = target.manager().await?;
    let before = CommandStats::fetch(&mut stats).await?;
    time_requests(&mut svc, &distinct, plan.warmup).await?;
    let commands = CommandStats::fetch(&mut stats).await?.since(&before);
    let per = u64::try_from(plan.warmup).unwrap_or(u64::MAX);
    let redis_requests = commands.breakdown(per, crate::stats::OUR_REQUESTS);
    // Then, key after key: a layered request, the same locker's lock + release, a PING.
    let [mut redis_distinct, mut redis_ping, mut redis_cycle] =
        [(); 3].map(|()| Latencies::default());
    for key in distinct.iter().cycle().skip(plan.warmup).take(n) {
        time_into(&mut svc, std::slice::from_ref(key), 1, &mut redis_distinct).await?;
        let t = Instant::now();
        redis
            .lock(key.to_str()?)
            .wait(WAIT)
            .await?
            .release()
            .await?;
        redis_cycle.record_since(t);
        let t = Instant::now();
        ping.once("").await?;
        redis_ping.record_since(t);
    }
    Ok(Layer {
        bare,
        memory_distinct,
        memory_hot,
        redis_distinct,
        redis_ping,
        redis_cycle,
        redis_requests,
    })
}
