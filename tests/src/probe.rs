//! Checks that test processes run inside their critical sections, in Redis, so that several OS
//! processes can be checked together.

/// A fencing-token check for storage: stores `ARGV[1]` in `KEYS[1]` when it is strictly above
/// the token stored there and returns 1; otherwise counts a violation in `KEYS[2]` and returns 0.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let server = lock_testkit::RedisServer::start();
/// let mut conn = server.client().await;
/// let check = redis::Script::new(lock_tests::probe::CHECK_FENCE);
/// let first: i64 = check.key("f").key("v").arg(2).invoke_async(&mut conn).await.unwrap();
/// let stale: i64 = check.key("f").key("v").arg(1).invoke_async(&mut conn).await.unwrap();
/// assert_eq!((first, stale), (1, 0));
/// assert_eq!(server.get("v").await.as_deref(), Some("1"));
/// # }
/// ```
pub const CHECK_FENCE: &str = r"
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > seen then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
redis.call('INCR', KEYS[2])
return 0
";
