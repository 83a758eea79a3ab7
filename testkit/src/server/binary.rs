//! Where the `redis-server` binary is, and the message that names the install command when it
//! is nowhere.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

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
    if let Some(path) = std::env::var_os(BINARY_ENV) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(missing_message(&format!(
            "${BINARY_ENV} points at {}, which is not a file",
            path.display()
        )));
    }
    let fallbacks: Vec<&Path> = FALLBACK_BINARIES.iter().map(Path::new).collect();
    find_redis_server_in(std::env::var_os("PATH").as_deref(), &fallbacks)
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
    let on_path = path_var
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"));
    let fallback = fallbacks.iter().map(|p| p.to_path_buf());
    on_path
        .chain(fallback)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            let places: Vec<String> = fallbacks.iter().map(|p| p.display().to_string()).collect();
            missing_message(&format!(
                "redis-server is not on PATH nor at {}",
                if places.is_empty() {
                    "any fallback location".to_owned()
                } else {
                    places.join(" or ")
                }
            ))
        })
}

pub(super) fn missing_message(what: &str) -> String {
    format!(
        "{what}. These tests and benches run real redis-server processes and never skip: install it \
         with `{INSTALL_COMMAND}` (the README's test command, `bash scripts/test.sh`, which .ci/run \
         runs, installs it when it is missing), or set {BINARY_ENV} to a redis-server binary."
    )
}
