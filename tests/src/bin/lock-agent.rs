//! A lock client in its own OS process, driven line by line on stdin by fault and waiting
//! tests (which can then SIGKILL or SIGSTOP it). Every answer is one line on stdout.
//!
//! ```text
//! lock-agent --url redis://127.0.0.1:PORT/
//! HOLD <key> <lease_ms> <fenced:0|1>      -> HELD <key> fence=<n|none>    | ERR <key> <error>
//! WRITE <key> <storage_key>               -> WRITE <key> ok|rejected held=<true|false>
//! RELEASE <key>                           -> RELEASED <key> ok            | RELEASED <key> err=<error>
//! WAIT <key> <id> <order_list> [fair]     -> (later) DONE <id>            | FAILED <id> <error>
//! ```
//!
//! `WRITE` is a fenced write to a storage key: accepted only if the held lock's fencing token is
//! at least the highest one the storage has seen. `WAIT` queues a waiter in a new task that, once
//! it holds the lock, appends `<id>` to the Redis list `<order_list>` and releases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockGuard, Locker};
use redis::Script;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Mutex;

/// Fenced storage: write only when the writer's token is not older than the last one seen.
const FENCED_WRITE: &str = r"
-- KEYS[1] the stored value, KEYS[2] the highest fencing token seen
-- ARGV[1] the writer's fencing token, ARGV[2] the value
-- Returns 1 when written, 0 when rejected as stale.
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < seen then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
";

/// Generous bounds for the storage connection: a test may pause this process or load the
/// machine, and a storage hiccup must not look like a lock failure.
fn storage_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(10)))
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(url) = args
        .iter()
        .position(|a| a == "--url")
        .and_then(|i| args.get(i + 1))
    else {
        say("ERR usage: lock-agent --url URL");
        std::process::exit(2);
    };
    let locker = match Locker::redis(url).await {
        Ok(l) => l,
        Err(e) => {
            say(&format!("ERR connect {e}"));
            std::process::exit(1);
        }
    };
    let storage = match redis::Client::open(url.as_str()) {
        Ok(c) => c,
        Err(e) => {
            say(&format!("ERR storage {e}"));
            std::process::exit(1);
        }
    };
    say("READY");
    let held: Arc<Mutex<HashMap<String, LockGuard>>> = Arc::default();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["HOLD", key, lease, fenced] => {
                let lease = Duration::from_millis(lease.parse().unwrap_or(1000));
                let mut req = locker.lock(key).lease(lease).wait(Duration::from_secs(10));
                if *fenced == "1" {
                    req = req.fenced();
                }
                match req.await {
                    Ok(g) => {
                        let fence = g.fence().map_or("none".into(), |f| f.to_string());
                        held.lock().await.insert((*key).to_owned(), g);
                        say(&format!("HELD {key} fence={fence}"));
                    }
                    Err(e) => say(&format!("ERR {key} {e}")),
                }
            }
            ["WRITE", key, storage_key] => {
                let map = held.lock().await;
                let Some(g) = map.get(*key) else {
                    say(&format!("ERR {key} not held"));
                    continue;
                };
                let fence = g.fence().unwrap_or(0);
                let held_now = g.is_held();
                let written = match storage
                    .get_multiplexed_async_connection_with_config(&storage_config())
                    .await
                {
                    Ok(mut conn) => Script::new(FENCED_WRITE)
                        .key(*storage_key)
                        .key(format!("{storage_key}:fence"))
                        .arg(fence)
                        .arg(format!("written-by-{fence}"))
                        .invoke_async::<i64>(&mut conn)
                        .await
                        .unwrap_or(-1),
                    Err(_) => -1,
                };
                let verdict = if written == 1 { "ok" } else { "rejected" };
                say(&format!("WRITE {key} {verdict} held={held_now}"));
            }
            ["RELEASE", key] => {
                let guard = held.lock().await.remove(*key);
                match guard {
                    Some(g) => match g.release().await {
                        Ok(()) => say(&format!("RELEASED {key} ok")),
                        Err(e) => say(&format!("RELEASED {key} err={e}")),
                    },
                    None => say(&format!("ERR {key} not held")),
                }
            }
            ["WAIT", key, id, order, rest @ ..] => {
                let fair = rest.first() == Some(&"fair");
                let (locker, storage) = (locker.clone(), storage.clone());
                let (key, id, order) = ((*key).to_owned(), (*id).to_owned(), (*order).to_owned());
                tokio::spawn(async move {
                    let mut req = locker.lock(&key).wait(Duration::from_secs(30));
                    if fair {
                        req = req.fair();
                    }
                    let result = req
                        .run(async {
                            let mut conn = storage
                                .get_multiplexed_async_connection_with_config(&storage_config())
                                .await?;
                            redis::cmd("RPUSH")
                                .arg(&order)
                                .arg(&id)
                                .exec_async(&mut conn)
                                .await
                        })
                        .await;
                    match result {
                        Ok(Ok(())) => say(&format!("DONE {id}")),
                        Ok(Err(e)) => say(&format!("FAILED {id} {e}")),
                        Err(e) => say(&format!("FAILED {id} {e}")),
                    }
                });
            }
            _ => say(&format!("ERR unknown command {line:?}")),
        }
    }
}
