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

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{Arg, Cmd, ErrorKind, RedisFuture, ServerErrorKind, Value};

/// A `ClusterConnection` for one call (cloned from the backend's, cheap), remembering the
/// script a `NOSCRIPT` asked to load.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    conn: ClusterConnection,
    /// The SHA1 of the last `EVALSHA` answered with `NOSCRIPT`, and then the body that
    /// `SCRIPT LOAD` offered for it.
    missing: Option<(Vec<u8>, Option<Vec<u8>>)>,
}

impl ClusterConn {
    pub(crate) fn new(conn: ClusterConnection) -> Self {
        ClusterConn {
            conn,
            missing: None,
        }
    }

    pub(crate) fn inner(&mut self) -> &mut ClusterConnection {
        &mut self.conn
    }
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
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        0
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
}
