//! Where the `redis-server` binary is, and the message that names the install command when it
//! is nowhere.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::binary::{find_binary, find_binary_in};

/// The command that installs the server, named in the panic message when it is missing.
pub const INSTALL_COMMAND: &str = "apt-get install -y redis-server";

/// Environment variable naming a `redis-server` binary to use instead of the one on `PATH`.
pub const BINARY_ENV: &str = "LOCK_TESTS_REDIS_SERVER";

/// Where `redis-server` is looked for when it is not on `PATH`.
const FALLBACK_BINARIES: &[&str] = &["/usr/bin/redis-server", "/usr/local/bin/redis-server"];

/// Finds the `redis-server` binary: `$LOCK_TESTS_REDIS_SERVER`, then `PATH`, then
/// `/usr/bin/redis-server` and `/usr/local/bin/redis-server`.
///
/// # Errors
/// A message naming the install command when there is none.
///
/// ```
/// match lock_testkit::server::find_redis_server() {
///     Ok(path) => assert!(path.ends_with("redis-server") || path.is_file()),
///     Err(message) => assert!(message.contains("apt-get install -y redis-server")),
/// }
/// ```
pub fn find_redis_server() -> Result<PathBuf, String> {
    find_binary(
        "redis-server",
        BINARY_ENV,
        FALLBACK_BINARIES,
        missing_message,
    )
}

/// [`find_redis_server`] over an explicit `PATH` value and fallback locations (no environment).
///
/// # Errors
/// A message naming the install command when no candidate is a file.
///
/// ```
/// let err = lock_testkit::server::find_redis_server_in(None, &[]).unwrap_err();
/// assert!(err.contains("apt-get install -y redis-server"));
/// ```
pub fn find_redis_server_in(
    path_var: Option<&OsStr>,
    fallbacks: &[&Path],
) -> Result<PathBuf, String> {
    find_binary_in("redis-server", path_var, fallbacks, missing_message)
}

pub(super) fn missing_message(what: &str) -> String {
    format!(
        "{what}. These tests and benches run real redis-server processes and never skip: install it \
         with `{INSTALL_COMMAND}` (the README's test command, `bash scripts/test.sh`, which .ci/run \
         runs, installs it when it is missing), or set {BINARY_ENV} to a redis-server binary."
    )
}
