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

/// A fence-checking store that also sees overlapping critical sections, for one lock key:
/// every section enters (`ARGV[1] = 'enter'`) and leaves (`'leave'`) through it, each time
/// with its fence (`ARGV[2]`) and an id of its own (`ARGV[3]`).
///
/// `KEYS[1]` the highest fence accepted, `KEYS[2]` the id of the section inside (the marker),
/// `KEYS[3]` a hash of counts (`entered`, `left`, `stale`, `overlap`). An `enter` is accepted
/// only when its fence is strictly above the highest one (else `stale`, nothing written); it
/// stores its fence and sets the marker to its id, and answers `overlap` instead of `ok` when
/// another section's marker was still set. A `leave` is accepted only when its fence is still
/// the highest and the marker is its own (it clears the marker); else `stale`. Every answer is
/// counted in `KEYS[3]`, `ok` as `entered` or `left`. One script, so each check is atomic.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let server = lock_testkit::RedisServer::start();
/// let mut conn = server.client().await;
/// let section = redis::Script::new(lock_tests::probe::SECTION);
/// let mut call = async |op: &str, fence: u64, id: &str| -> String {
///     let mut call = section.key("f");
///     call.key("in").key("counts").arg(op).arg(fence).arg(id);
///     call.invoke_async(&mut conn).await.unwrap()
/// };
/// assert_eq!(call("enter", 5, "a").await, "ok");
/// assert_eq!(call("enter", 6, "b").await, "overlap"); // a is still inside
/// assert_eq!(call("leave", 5, "a").await, "stale"); // a later fence got in
/// assert_eq!(call("leave", 6, "b").await, "ok");
/// assert_eq!(call("enter", 6, "c").await, "stale"); // not above the highest
/// assert_eq!(server.query::<i64>(redis::cmd("HGET").arg("counts").arg("stale").clone()).await, 2);
/// # }
/// ```
pub const SECTION: &str = r"
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[2])
local inside = redis.call('GET', KEYS[2])
if ARGV[1] == 'enter' then
  if fence <= seen then
    redis.call('HINCRBY', KEYS[3], 'stale', 1)
    return 'stale'
  end
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[2], ARGV[3])
  if inside then
    redis.call('HINCRBY', KEYS[3], 'overlap', 1)
    return 'overlap'
  end
  redis.call('HINCRBY', KEYS[3], 'entered', 1)
  return 'ok'
end
if fence ~= seen or inside ~= ARGV[3] then
  redis.call('HINCRBY', KEYS[3], 'stale', 1)
  return 'stale'
end
redis.call('DEL', KEYS[2])
redis.call('HINCRBY', KEYS[3], 'left', 1)
return 'ok'
";

/// The store keys of [`SECTION`] for a lock key whose fence key is `fence_key`: the highest
/// fence and the marker (the counts are shared by all the keys of a run).
///
/// ```
/// let [fence, marker] = lock_tests::probe::section_keys("fence-1");
/// assert_eq!((fence.as_str(), marker.as_str()), ("fence-1", "fence-1:inside"));
/// ```
pub fn section_keys(fence_key: &str) -> [String; 2] {
    [fence_key.to_owned(), format!("{fence_key}:inside")]
}
