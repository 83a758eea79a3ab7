//! The async helpers tests read and poke a server with: one fresh connection per call,
//! authenticated as the admin, panicking on failure as assertions do.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};

use super::RedisServer;

/// Bound on the harness client's connects and answers (generous: CI machines are busy).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

impl RedisServer {
    /// A new connection (authenticated with the `--requirepass` password, if any) for
    /// assertions; commands time out after 5 s.
    ///
    /// # Panics
    /// When the server cannot be reached.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// let mut conn = server.client().await;
    /// let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    /// assert_eq!(pong, "PONG");
    /// # }
    /// ```
    pub async fn client(&self) -> MultiplexedConnection {
        self.try_client()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to redis-server on port {}: {e}", self.port))
    }

    /// Like [`client`](Self::client), returning the error instead of panicking.
    ///
    /// # Errors
    /// The connection error (server stopped, paused...).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut server = lock_testkit::RedisServer::start();
    /// server.stop();
    /// assert!(server.try_client().await.is_err());
    /// # }
    /// ```
    pub async fn try_client(&self) -> Result<MultiplexedConnection, redis::RedisError> {
        let client = Client::open(self.admin_url())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CLIENT_TIMEOUT))
            .set_response_timeout(Some(CLIENT_TIMEOUT));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Runs one command on a fresh connection and converts the answer.
    ///
    /// # Panics
    /// When the command fails or the answer does not convert.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// let n: i64 = server.query(redis::cmd("DBSIZE")).await;
    /// assert_eq!(n, 0);
    /// # }
    /// ```
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> T {
        let mut conn = self.client().await;
        match cmd.query_async(&mut conn).await {
            Ok(v) => v,
            Err(e) => panic!("redis-server on port {}: command failed: {e}", self.port),
        }
    }

    /// Like [`query`](Self::query), returning the error instead of panicking: for polling a
    /// server that may be down, paused, or refusing (a cluster node during a failover).
    ///
    /// # Errors
    /// The connection or command error, or a reply that does not convert.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// let n: Result<i64, _> = server.try_query(redis::cmd("DBSIZE")).await;
    /// assert_eq!(n.ok(), Some(0));
    /// # }
    /// ```
    pub async fn try_query<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
    ) -> Result<T, redis::RedisError> {
        let mut conn = self.try_client().await?;
        cmd.query_async(&mut conn).await
    }

    /// `GET key`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// assert_eq!(server.get("missing").await, None);
    /// # }
    /// ```
    pub async fn get(&self, key: &str) -> Option<String> {
        self.query(redis::cmd("GET").arg(key).clone()).await
    }

    /// `SET key value`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// server.set("k", "1").await;
    /// assert_eq!(server.get("k").await.as_deref(), Some("1"));
    /// # }
    /// ```
    pub async fn set(&self, key: &str, value: &str) {
        let () = self
            .query(redis::cmd("SET").arg(key).arg(value).clone())
            .await;
    }

    /// `SET key value`, then `WAIT replicas 5000` on the same connection (`WAIT` counts the
    /// writes of its own connection): the write is on at least `replicas` replicas when this
    /// returns, so a failover right after cannot lose it.
    ///
    /// # Panics
    /// When fewer replicas acknowledged the write within 5 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let primary = lock_testkit::RedisServer::start();
    /// primary.set_replicated("k", "v", 1).await;
    /// # }
    /// ```
    pub async fn set_replicated(&self, key: &str, value: &str, replicas: i64) {
        let mut conn = self.client().await;
        let () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("SET {key} on port {}: {e}", self.port()));
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(5000)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("WAIT on port {}: {e}", self.port()));
        assert!(
            acked >= replicas,
            "{key} reached {acked} replica(s) of {replicas} within 5 s"
        );
    }

    /// `PTTL key`: milliseconds left, `-1` without expiry, `-2` when the key does not exist.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// assert_eq!(server.pttl("missing").await, -2);
    /// # }
    /// ```
    pub async fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key).clone()).await
    }

    /// `DEL key`: how many keys were deleted (0 or 1).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// assert_eq!(server.del("missing").await, 0);
    /// # }
    /// ```
    pub async fn del(&self, key: &str) -> i64 {
        self.query(redis::cmd("DEL").arg(key).clone()).await
    }

    /// Makes `key` a string of `len` zero bytes with one short command (`SETRANGE key len-1`):
    /// how a test fills a server that has a `maxmemory` (the server checks memory before a
    /// command runs, counting the command's own bytes, so a short command that makes a large
    /// value is taken, and leaves the server over its limit).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// server.fill("filler", 1024).await;
    /// assert_eq!(server.get("filler").await.map(|v| v.len()), Some(1024));
    /// # }
    /// ```
    pub async fn fill(&self, key: &str, len: usize) {
        let _: i64 = self
            .query(
                redis::cmd("SETRANGE")
                    .arg(key)
                    .arg(len.saturating_sub(1))
                    .arg(b"\0")
                    .clone(),
            )
            .await;
    }

    /// `EXISTS key`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// assert!(!server.exists("missing").await);
    /// # }
    /// ```
    pub async fn exists(&self, key: &str) -> bool {
        self.query::<i64>(redis::cmd("EXISTS").arg(key).clone())
            .await
            == 1
    }

    /// `DBSIZE`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert_eq!(lock_testkit::RedisServer::start().dbsize().await, 0);
    /// # }
    /// ```
    pub async fn dbsize(&self) -> i64 {
        self.query(redis::cmd("DBSIZE")).await
    }

    /// Every key matching a glob `pattern`, sorted (walks `SCAN`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// server.set("a:1", "x").await;
    /// assert_eq!(server.keys("a:*").await, vec!["a:1".to_owned()]);
    /// # }
    /// ```
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut conn = self.client().await;
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("SCAN failed on port {}: {e}", self.port));
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// `FLUSHALL`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// server.set("k", "v").await;
    /// server.flushall().await;
    /// assert_eq!(server.dbsize().await, 0);
    /// # }
    /// ```
    pub async fn flushall(&self) {
        let () = self.query(redis::cmd("FLUSHALL")).await;
    }

    /// `INFO <section>` as text.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// assert!(server.info("server").await.contains("redis_version:"));
    /// # }
    /// ```
    pub async fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section).clone()).await
    }

    /// `INFO commandstats` as a map from command name (lowercase, `client|kill` for
    /// subcommands) to its number of calls since start (or the last `CONFIG RESETSTAT`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// server.set("k", "v").await;
    /// assert_eq!(server.commandstats().await.get("set"), Some(&1));
    /// # }
    /// ```
    pub async fn commandstats(&self) -> BTreeMap<String, u64> {
        parse_commandstats(&self.info("commandstats").await)
    }

    /// `CONFIG RESETSTAT`: zeroes the command statistics.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// server.set("k", "v").await;
    /// server.reset_stats().await;
    /// assert_eq!(server.commandstats().await.get("set"), None);
    /// # }
    /// ```
    pub async fn reset_stats(&self) {
        let () = self
            .query(redis::cmd("CONFIG").arg("RESETSTAT").clone())
            .await;
    }

    /// Closes every client connection (normal and pub/sub) except the helper's own; returns how
    /// many were closed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// let _other = server.client().await;
    /// assert!(server.client_kill_all().await >= 1);
    /// # }
    /// ```
    pub async fn client_kill_all(&self) -> i64 {
        let mut conn = self.client().await;
        let mut killed = 0;
        for kind in ["normal", "pubsub"] {
            let n: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg(kind)
                .arg("SKIPME")
                .arg("yes")
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("CLIENT KILL failed on port {}: {e}", self.port));
            killed += n;
        }
        killed
    }

    /// Every channel with a subscriber, sharded (`PUBSUB SHARDCHANNELS`) and plain.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::start();
    /// assert!(server.subscribed_channels().await.is_empty());
    /// # }
    /// ```
    pub async fn subscribed_channels(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .query(redis::cmd("PUBSUB").arg("SHARDCHANNELS").clone())
            .await;
        let plain: Vec<String> = self
            .query(redis::cmd("PUBSUB").arg("CHANNELS").clone())
            .await;
        all.extend(plain);
        all
    }

    /// `CLUSTER KEYSLOT key`: the cluster hash slot the server computes for `key`.
    ///
    /// # Panics
    /// On a standalone server (Redis 7.0 refuses the command there): use
    /// [`start_cluster_node`](Self::start_cluster_node).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let node = lock_testkit::RedisServer::start_cluster_node();
    /// assert_eq!(node.keyslot("{user1000}.following").await, node.keyslot("user1000").await);
    /// # }
    /// ```
    pub async fn keyslot(&self, key: &str) -> u16 {
        self.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).clone())
            .await
    }
}

/// Parses the text of `INFO commandstats`.
///
/// ```
/// let stats = lock_testkit::server::parse_commandstats(
///     "# Commandstats\r\ncmdstat_evalsha:calls=3,usec=9,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n",
/// );
/// assert_eq!(stats.get("evalsha"), Some(&3));
/// ```
pub fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .trim()
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}
