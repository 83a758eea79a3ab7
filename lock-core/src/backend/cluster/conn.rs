//! The command connection of the cluster backend: redis-rs's `ClusterConnection` (slot routing,
//! MOVED/ASK, reconnects), with `NOSCRIPT` handled on the node that answered.
//!
//! redis-rs answers `NOSCRIPT` by sending `SCRIPT LOAD` to every node of the cluster, replicas
//! included, and fails when any one of them is down (right after a failover or a restart,
//! exactly when scripts are missing). The shared script code (`invoke_async`, `evalsha_once`)
//! calls `EVALSHA`, then `SCRIPT LOAD`, then `EVALSHA` again on the connection it is given;
//! this adapter turns that `SCRIPT LOAD` into nothing and the second `EVALSHA` into an `EVAL`
//! of the script's body with the same keys and arguments. `EVAL` is routed by its first key
//! like `EVALSHA` (following MOVED and ASK), runs the script, and caches it on the node that
//! ran it: only that node is involved.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{Arg, Cmd, ErrorKind, RedisFuture, ServerErrorKind, Value};

use super::Topology;
use crate::sync::Mutex;

/// A `ClusterConnection` for one call (cloned from the backend's, cheap), remembering the
/// script a `NOSCRIPT` asked to load.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    conn: ClusterConnection,
    /// The SHA1 of the last `EVALSHA` answered with `NOSCRIPT`, and then the body that
    /// `SCRIPT LOAD` offered for it.
    missing: Option<(Vec<u8>, Option<Vec<u8>>)>,
    /// The backend's command connection follows failovers of nodes that do not answer.
    follow: Option<Arc<Follow>>,
}

/// redis-rs reads its slot map again after MOVED or a dropped connection, never after a
/// timeout: requests for the slots of a primary that stopped answering (stalled, partitioned)
/// and was failed over would go to it for good. After a request times out, the backend's own
/// map is read again from a node that answers; when any read changed it since the command
/// connection was made (a failover, a reshard), a new command connection replaces it.
struct Follow {
    current: Mutex<ClusterConnection>,
    /// The map's generation when `current` was made.
    made_at: AtomicU64,
    topology: Arc<Topology>,
    busy: AtomicBool,
}

impl Follow {
    fn after_timeout(self: &Arc<Self>, slot: u16) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let follow = self.clone();
        runtime.spawn(async move {
            let suspect = follow.topology.shard_of(slot);
            follow.topology.refresh(None, suspect.as_deref()).await;
            let generation = follow.topology.generation();
            if generation != follow.made_at.load(Ordering::Acquire)
                && let Some(conn) = follow.topology.connect_command().await
            {
                tracing::debug!("the slot map changed after a timeout: new command connection");
                *follow.current.lock() = conn;
                follow.made_at.store(generation, Ordering::Release);
            }
            follow.busy.store(false, Ordering::Release);
        });
    }
}

impl ClusterConn {
    pub(crate) fn new(conn: ClusterConnection) -> Self {
        ClusterConn {
            conn,
            missing: None,
            follow: None,
        }
    }

    /// This connection, replaced by a new one when a request timed out and the slot map has
    /// changed since it was made (see `Follow`).
    pub(crate) fn following(self, topology: Arc<Topology>) -> Self {
        let follow = Follow {
            current: Mutex::new(self.conn.clone()),
            made_at: AtomicU64::new(topology.generation()),
            topology,
            busy: AtomicBool::new(false),
        };
        ClusterConn {
            follow: Some(Arc::new(follow)),
            ..self
        }
    }

    pub(crate) fn inner(&mut self) -> &mut ClusterConnection {
        &mut self.conn
    }

    /// Takes the current command connection (when following).
    fn refresh(&mut self) {
        if let Some(follow) = &self.follow {
            self.conn = follow.current.lock().clone();
        }
    }

    /// After an answer: a timeout of a request for `slot` may mean a failover (see `Follow`).
    fn answered<T>(&self, answer: &redis::RedisResult<T>, slot: Option<u16>) {
        if let (Some(follow), Err(e), Some(slot)) = (&self.follow, answer, slot)
            && e.is_timeout()
        {
            follow.after_timeout(slot);
        }
    }
}

/// The slot of a command's first key, as the backend sends them (`EVALSHA sha n key ...`,
/// `EVAL body n key ...`, else the first argument).
fn slot_of(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter();
    let name = simple(args.next())?;
    let key = if is(Some(name), "EVALSHA") || is(Some(name), "EVAL") {
        let _script = args.next();
        let keys = simple(args.next())?;
        if keys == b"0" {
            return None;
        }
        simple(args.next())?
    } else {
        simple(args.next())?
    };
    Some(key_slot(key))
}

fn simple(arg: Option<Arg<&[u8]>>) -> Option<&[u8]> {
    match arg {
        Some(Arg::Simple(bytes)) => Some(bytes),
        _ => None,
    }
}

fn is(arg: Option<&[u8]>, name: &str) -> bool {
    arg.is_some_and(|a| a.eq_ignore_ascii_case(name.as_bytes()))
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.refresh();
            let answer = self.send(cmd).await;
            self.answered(&answer, slot_of(cmd));
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.refresh();
            let answer = self.conn.req_packed_commands(pipeline, offset, count).await;
            let slot = pipeline.cmd_iter().find_map(slot_of);
            self.answered(&answer, slot);
            answer
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl ClusterConn {
    /// One command, `NOSCRIPT` handled on the node that answered (see the module's doc).
    async fn send(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        {
            let mut args = cmd.args_iter();
            let name = simple(args.next());
            let first = simple(args.next());
            if is(name, "SCRIPT") && is(first, "LOAD") {
                // The body of the script that was missing: kept for the EVAL that follows.
                if let (Some((sha, body)), Some(code)) =
                    (self.missing.as_mut(), simple(args.next()))
                {
                    *body = Some(code.to_vec());
                    return Ok(Value::BulkString(sha.clone()));
                }
            }
            if is(name, "EVALSHA")
                && let Some(sha) = first
            {
                if let Some((missing, Some(body))) = &self.missing
                    && missing.as_slice() == sha
                {
                    let mut eval = redis::cmd("EVAL");
                    eval.arg(body.as_slice());
                    for arg in cmd.args_iter().skip(2) {
                        if let Arg::Simple(bytes) = arg {
                            eval.arg(bytes);
                        }
                    }
                    return self.conn.req_packed_command(&eval).await;
                }
                let answer = self.conn.req_packed_command(cmd).await;
                if let Err(e) = &answer
                    && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                {
                    self.missing = Some((sha.to_vec(), None));
                }
                return answer;
            }
            self.conn.req_packed_command(cmd).await
        }
    }
}

/// The hash slot of a key (CRC16/XMODEM of its hash tag, modulo 16384), as the cluster
/// computes it.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"lock:{a}:queue"), key_slot(b"a"));
    }

    #[test]
    fn a_command_s_slot_is_its_first_key_s() {
        let evalsha = redis::cmd("EVALSHA")
            .arg("sha")
            .arg(2)
            .arg("{a}")
            .arg("{b}")
            .clone();
        assert_eq!(slot_of(&evalsha), Some(key_slot(b"a")));
        let set = redis::cmd("SET").arg("{b}").arg("v").clone();
        assert_eq!(slot_of(&set), Some(key_slot(b"b")));
        assert_eq!(
            slot_of(&redis::cmd("EVALSHA").arg("sha").arg(0).clone()),
            None
        );
        assert_eq!(slot_of(&redis::cmd("PING").clone()), None);
    }
}
