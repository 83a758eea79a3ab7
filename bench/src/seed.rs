//! The seed design users start from: `SET key token NX PX lease`, and when it is taken, sleep a
//! fixed 10 ms and try again; release with a compare-and-delete script. Same redis-rs
//! `ConnectionManager` as lock-core, so the difference measured is the design, not the client.
//!
//! (The seeds use `SETNX`; `SET NX PX` is its atomic form with a lease, the same one round trip.)

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::Result;

/// The seeds' polling period.
pub(crate) const POLL: Duration = Duration::from_millis(10);

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// A `SET NX` + sleep-polling locker.
#[derive(Clone)]
pub(crate) struct Seed {
    conn: ConnectionManager,
    lease_ms: u64,
}

/// A lock taken by [`Seed`].
#[derive(Debug)]
pub(crate) struct SeedGuard {
    key: String,
    token: String,
}

impl Seed {
    pub(crate) fn new(conn: ConnectionManager, lease: Duration) -> Self {
        Seed {
            conn,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        }
    }

    pub(crate) async fn lock(&self, key: &str, wait: Duration) -> Result<SeedGuard> {
        let key = format!("seed:{key}");
        let token = random_token()?;
        let deadline = Instant::now() + wait;
        let mut conn = self.conn.clone();
        loop {
            let ok: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(self.lease_ms)
                .query_async(&mut conn)
                .await?;
            if ok.is_some() {
                return Ok(SeedGuard { key, token });
            }
            if Instant::now() + POLL > deadline {
                return Err(format!("seed: timed out waiting for {key}").into());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub(crate) async fn release(&self, guard: SeedGuard) -> Result<()> {
        let mut conn = self.conn.clone();
        let deleted: i64 = RELEASE
            .key(&guard.key)
            .arg(&guard.token)
            .invoke_async(&mut conn)
            .await?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("seed: {} was no longer ours at release", guard.key).into())
        }
    }
}

/// 128 random bits as hex, as lock-core draws its tokens.
pub(crate) fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| format!("getrandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
