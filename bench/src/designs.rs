//! The three designs measured side by side, behind one small interface: ours (lock-core), the
//! seed design users start from, and rslock.
//!
//! The seed: `SET key token NX PX lease`, and when it is taken, sleep a fixed 10 ms and try
//! again; release with a compare-and-delete script; on the same redis-rs `ConnectionManager` as
//! lock-core, so the difference measured is the design, not the client. (The seeds use
//! `SETNX`; `SET NX PX` is its atomic form with a lease, the same one round trip.)

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::{LockGuard, Locker, RedisBackend};
use redis::Script;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::Result;
use crate::server::Target;
use crate::stats::{OUR_REQUESTS, PEER_REQUESTS};

/// The seed's polling period.
const POLL: Duration = Duration::from_millis(10);

static SEED_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// Which design.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Ours,
    Seed,
    Rslock,
}

impl Kind {
    pub(crate) const ALL: [Kind; 3] = [Kind::Ours, Kind::Seed, Kind::Rslock];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Ours => "ours",
            Kind::Seed => "seed",
            Kind::Rslock => "rslock",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Self> {
        let kind = Kind::ALL.into_iter().find(|k| k.name() == s);
        Ok(kind.ok_or_else(|| format!("unknown design `{s}`"))?)
    }

    /// The commands this design sends as requests (see [`OUR_REQUESTS`]).
    pub(crate) fn requests(self) -> &'static str {
        match self {
            Kind::Ours => OUR_REQUESTS,
            Kind::Seed | Kind::Rslock => PEER_REQUESTS,
        }
    }
}

/// One connected locker of some design. Cheap to clone (all share one connection).
#[derive(Clone)]
pub(crate) enum Design {
    Ours(Locker),
    /// The seed's connection and lease in ms.
    Seed(ConnectionManager, u64),
    /// The manager and the TTL of its locks.
    Rslock(rslock::LockManager, Duration),
}

/// A held lock of some design.
pub(crate) enum Held {
    Ours(LockGuard),
    /// The seed's key and token.
    Seed(String, String),
    Rslock(rslock::Lock),
}

impl Design {
    /// Connects a locker of `kind` to `target`, with `lease` as its lease (ours renews it with
    /// its watchdog, as by default; the others just set it).
    pub(crate) async fn connect(kind: Kind, target: &Target, lease: Duration) -> Result<Self> {
        Ok(match kind {
            Kind::Ours => Design::Ours(ours(target, lease, true).await?),
            Kind::Seed => Design::Seed(
                target.manager().await?,
                u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            ),
            Kind::Rslock => {
                let manager = rslock::LockManager::from_clients(vec![target.client()?]);
                Design::Rslock(manager, lease)
            }
        })
    }

    /// lock-core's counts of calls to Redis and of local hand-offs (`LockerStats`
    /// `backend_calls`, `local_handoffs`); `None` for the peers.
    pub(crate) fn our_counts(&self) -> Option<[u64; 2]> {
        match self {
            Design::Ours(l) => Some([l.stats().backend_calls, l.stats().local_handoffs]),
            Design::Seed(..) | Design::Rslock(..) => None,
        }
    }

    /// Takes the lock on `key`, waiting up to `wait` with the design's own way of waiting
    /// (ours: notification + local queue; seed: 10 ms polling; rslock: its default retry
    /// loop, 3 tries 0-200 ms apart, looped by `acquire_no_guard`).
    pub(crate) async fn lock(&self, key: &str, wait: Duration) -> Result<Held> {
        match self {
            Design::Ours(l) => Ok(Held::Ours(l.lock(key).wait(wait).await?)),
            Design::Seed(conn, lease_ms) => {
                let (key, token) = (format!("seed:{key}"), random_token()?);
                let deadline = Instant::now() + wait;
                let mut conn = conn.clone();
                loop {
                    let mut set = redis::cmd("SET");
                    set.arg(&key).arg(&token).arg("NX").arg("PX").arg(lease_ms);
                    let ok: Option<String> = set.query_async(&mut conn).await?;
                    if ok.is_some() {
                        return Ok(Held::Seed(key, token));
                    }
                    if Instant::now() + POLL > deadline {
                        return Err(format!("seed: timed out waiting for {key}").into());
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
            Design::Rslock(m, lease) => {
                let resource = format!("rslock:{key}");
                let acquire = m.acquire_no_guard(resource.as_str(), *lease);
                match tokio::time::timeout(wait, acquire).await {
                    Ok(Ok(lock)) => Ok(Held::Rslock(lock)),
                    Ok(Err(e)) => Err(format!("rslock: {e}").into()),
                    Err(_) => Err(format!("rslock: timed out waiting for {resource}").into()),
                }
            }
        }
    }

    pub(crate) async fn release(&self, held: Held) -> Result<()> {
        match (self, held) {
            (_, Held::Ours(g)) => Ok(g.release().await?),
            (Design::Seed(conn, _), Held::Seed(key, token)) => {
                let mut conn = conn.clone();
                let mut release = SEED_RELEASE.key(&key);
                let deleted: i64 = release.arg(&token).invoke_async(&mut conn).await?;
                match deleted {
                    1 => Ok(()),
                    _ => Err(format!("seed: {key} was no longer ours at release").into()),
                }
            }
            (Design::Rslock(m, _), Held::Rslock(lock)) => {
                m.unlock(&lock).await;
                Ok(())
            }
            _ => Err("a lock released through another design".into()),
        }
    }
}

/// lock-core's defaults of local hand-off, set explicitly so the figures name what they ran.
pub(crate) const LOCAL_TURNS: u32 = 64;
pub(crate) const LOCAL_HOLD: Duration = Duration::from_millis(50);

/// A lock-core `Locker` on `target` with this lease (watchdog on), local hand-off on or off.
pub(crate) async fn ours(target: &Target, lease: Duration, local_handoff: bool) -> Result<Locker> {
    let backend = RedisBackend::connect(&target.url).await?;
    let builder = Locker::builder(backend).lease(lease);
    let builder = builder
        .local_handoff(local_handoff)
        .local_turns(LOCAL_TURNS);
    let builder = builder.local_hold(LOCAL_HOLD);
    // The grace (opt-in in lock-core) is on at its measured length, 1 ms; another length can
    // be set for a measurement (bench/NOTES.md).
    let grace = match std::env::var(LOCAL_GRACE_ENV) {
        Ok(us) => Duration::from_micros(us.parse()?),
        Err(_) => LOCAL_GRACE,
    };
    let builder = builder.local_grace(grace);
    Ok(builder.try_build()?)
}

/// Ours' `local_grace` unless [`LOCAL_GRACE_ENV`] says otherwise.
pub(crate) const LOCAL_GRACE: Duration = Duration::from_millis(1);

/// Sets `local_grace` (in microseconds) for ours, in both processes (the child inherits it).
pub(crate) const LOCAL_GRACE_ENV: &str = "LOCK_BENCH_LOCAL_GRACE_US";

/// 128 random bits as hex, as a user writing the seed design would draw them: from rand's
/// thread-local CSPRNG, formatted in one `format!`. (Until 2026-12-02 this formatted each of
/// 16 bytes from `getrandom` separately: about 9,800 instructions per lock, a quarter of the
/// seed's client cost, which flattered ours in every comparison.)
fn random_token() -> Result<String> {
    Ok(format!("{:032x}", rand::random::<u128>()))
}
