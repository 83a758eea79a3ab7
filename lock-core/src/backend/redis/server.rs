//! What `connect` learns of the server: its major version and whether it runs in cluster
//! mode, from `HELLO` or, on older servers, `INFO`; a Sentinel is refused.

use super::conn::Conn;
use redis::Value;

use super::permissions::{ACL_HINT, is_noperm};
use crate::LockError;

/// What `connect` learns of the server.
pub(super) struct ServerInfo {
    pub(super) major: u32,
    pub(super) cluster: bool,
}

/// Version and mode from `HELLO` (no protocol argument: it answers in the current protocol,
/// and needs no `@dangerous` permission; Redis 6.2+), else from `INFO` (older servers).
pub(super) async fn server_info(conn: &mut Conn) -> Result<ServerInfo, LockError> {
    let hello_error = match redis::cmd("HELLO").query_async::<Value>(conn).await {
        Ok(reply) => {
            if hello_field(&reply, "mode").as_deref() == Some("sentinel") {
                return Err(sentinel_refused());
            }
            if let Some(version) = hello_field(&reply, "version") {
                return Ok(ServerInfo {
                    major: major_version(&version),
                    cluster: hello_field(&reply, "mode").as_deref() == Some("cluster"),
                });
            }
            None
        }
        Err(e) => Some(e),
    };
    let mut info = async |section: &str| {
        redis::cmd("INFO")
            .arg(section)
            .query_async::<String>(&mut *conn)
            .await
    };
    match (info("server").await, info("cluster").await) {
        (Ok(server), _) if server.contains("redis_mode:sentinel") => Err(sentinel_refused()),
        // Whatever answers INFO without a version is not a Redis server (a peer answering
        // every command alike).
        (Ok(server), _) if !server.contains("redis_version:") => Err(LockError::backend(
            "connect",
            None,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the server answered INFO with no redis_version: not Redis? ({:?})",
                    server.chars().take(80).collect::<String>()
                ),
            ),
        )),
        (Ok(server), Ok(cluster)) => Ok(ServerInfo {
            major: server_major_version(&server),
            cluster: cluster.contains("cluster_enabled:1"),
        }),
        (Err(e), _) | (_, Err(e)) => match hello_error {
            Some(hello) if is_noperm(&hello) || is_noperm(&e) => Err(LockError::config(format!(
                "the Redis user may run neither HELLO nor INFO ({hello}; {e}); grant +@connection: {ACL_HINT}"
            ))),
            _ => Err(LockError::backend("connect", None, e)),
        },
    }
}

/// A Sentinel answered where a data server was expected: it keeps no keys (its commands are
/// not the lock's), so nothing would work.
fn sentinel_refused() -> LockError {
    LockError::config(
        "the server is a Redis Sentinel, which keeps no locks: connect with RedisSentinelBackend naming the primary it watches (lock-admin: --url redis+sentinel://h1:26379,h2:26379/MASTER)",
    )
}

/// A field of a `HELLO` answer: a map in RESP3, a flat list of names and values in RESP2.
fn hello_field(reply: &Value, name: &str) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .and_then(|(_, v)| text(v)),
        Value::Array(items) => items
            .chunks_exact(2)
            .find(|pair| text(&pair[0]).as_deref() == Some(name))
            .and_then(|pair| text(&pair[1])),
        _ => None,
    }
}

fn server_major_version(info: &str) -> u32 {
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map_or(0, major_version)
}

/// `7` for `"7.0.15"`; 0 when unreadable.
fn major_version(version: &str) -> u32 {
    version
        .trim()
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parse() {
        assert_eq!(
            server_major_version("# Server\r\nredis_version:7.0.15\r\n"),
            7
        );
        assert_eq!(server_major_version("garbage"), 0);
        assert_eq!(major_version("6.2.14"), 6);
        assert_eq!(major_version(""), 0);
    }

    #[test]
    fn hello_fields_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("server"),
            bulk("redis"),
            bulk("version"),
            bulk("7.0.15"),
            bulk("proto"),
            Value::Int(2),
            bulk("mode"),
            bulk("cluster"),
        ]);
        assert_eq!(hello_field(&resp2, "version").as_deref(), Some("7.0.15"));
        assert_eq!(hello_field(&resp2, "mode").as_deref(), Some("cluster"));
        assert_eq!(hello_field(&resp2, "proto"), None);
        assert_eq!(hello_field(&resp2, "role"), None);
        let resp3 = Value::Map(vec![
            (bulk("version"), bulk("6.2.0")),
            (bulk("mode"), Value::SimpleString("standalone".into())),
        ]);
        assert_eq!(hello_field(&resp3, "version").as_deref(), Some("6.2.0"));
        assert_eq!(hello_field(&resp3, "mode").as_deref(), Some("standalone"));
        assert_eq!(hello_field(&Value::Nil, "version"), None);
        // An odd-length list is read pair by pair, never out of bounds.
        assert_eq!(
            hello_field(&Value::Array(vec![bulk("version")]), "version"),
            None
        );
    }
}
