//! The three designs measured side by side: ours (lock-core), the seed (`SET NX` + 10 ms
//! polling) and rslock, behind one small interface.

use std::time::Duration;

use lock_core::{LockGuard, Locker, RedisBackend};

use crate::Result;
use crate::seed::{Seed, SeedGuard};
use crate::server::Target;

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
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown design `{s}`").into())
    }

    /// The commands this design sends as requests (see [`crate::stats::OUR_REQUESTS`]).
    pub(crate) fn requests(self) -> &'static [&'static str] {
        match self {
            Kind::Ours => crate::stats::OUR_REQUESTS,
            Kind::Seed | Kind::Rslock => crate::stats::PEER_REQUESTS,
        }
    }
}

/// One connected locker of some design. Cheap to clone (all share one connection).
#[derive(Clone)]
pub(crate) enum Design {
    Ours(Locker),
    Seed(Seed),
    /// The manager and the TTL of its locks.
    Rslock(rslock::LockManager, Duration),
}

/// A held lock of some design.
pub(crate) enum Held {
    Ours(LockGuard),
    Seed(SeedGuard),
    Rslock(rslock::Lock),
}

impl Design {
    /// Connects a locker of `kind` to `target`, with `lease` as its lease (ours renews it with
    /// its watchdog, as by default; the others just set it).
    pub(crate) async fn connect(kind: Kind, target: &Target, lease: Duration) -> Result<Self> {
        Ok(match kind {
            Kind::Ours => {
                let backend = RedisBackend::connect(&target.url).await?;
                Design::Ours(Locker::builder(backend).lease(lease).try_build()?)
            }
            Kind::Seed => Design::Seed(Seed::new(target.manager().await?, lease)),
            Kind::Rslock => {
                let manager = rslock::LockManager::from_clients(vec![target.client()?]);
                Design::Rslock(manager, lease)
            }
        })
    }

    /// lock-core's count of calls to Redis (`LockerStats::backend_calls`); `None` for the peers.
    pub(crate) fn backend_calls(&self) -> Option<u64> {
        match self {
            Design::Ours(l) => Some(l.stats().backend_calls),
            Design::Seed(_) | Design::Rslock(..) => None,
        }
    }

    /// Takes the lock on `key`, waiting up to `wait` with the design's own way of waiting
    /// (ours: notification + local queue; seed: 10 ms polling; rslock: its default retry
    /// loop, 3 tries 0-200 ms apart, looped by `acquire_no_guard`).
    pub(crate) async fn lock(&self, key: &str, wait: Duration) -> Result<Held> {
        match self {
            Design::Ours(l) => Ok(Held::Ours(l.lock(key).wait(wait).await?)),
            Design::Seed(s) => Ok(Held::Seed(s.lock(key, wait).await?)),
            Design::Rslock(m, lease) => {
                let resource = format!("rslock:{key}");
                match tokio::time::timeout(wait, m.acquire_no_guard(resource.as_str(), *lease))
                    .await
                {
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
            (Design::Seed(s), Held::Seed(g)) => s.release(g).await,
            (Design::Rslock(m, _), Held::Rslock(lock)) => {
                m.unlock(&lock).await;
                Ok(())
            }
            _ => Err("a lock released through another design".into()),
        }
    }
}
