//! Finding the server binaries the kit runs (`redis-server`, `etcd`): an environment variable
//! naming one, then `PATH`, then the usual install locations; or a message naming the install
//! command.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Finds `name`: `$<env>` when set (it must be a file), then `PATH`, then `fallbacks`.
/// The error is what was wrong, turned into the full message by `missing`.
pub(crate) fn find_binary(
    name: &str,
    env: &str,
    fallbacks: &[&str],
    missing: impl Fn(&str) -> String,
) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(env) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(missing(&format!(
            "${env} points at {}, which is not a file",
            path.display()
        )));
    }
    let fallbacks: Vec<&Path> = fallbacks.iter().map(Path::new).collect();
    find_binary_in(
        name,
        std::env::var_os("PATH").as_deref(),
        &fallbacks,
        missing,
    )
}

/// [`find_binary`] over an explicit `PATH` value and fallback locations (no environment).
pub(crate) fn find_binary_in(
    name: &str,
    path_var: Option<&OsStr>,
    fallbacks: &[&Path],
    missing: impl Fn(&str) -> String,
) -> Result<PathBuf, String> {
    let on_path = path_var
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name));
    let fallback = fallbacks.iter().map(|p| p.to_path_buf());
    on_path
        .chain(fallback)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            let places: Vec<String> = fallbacks.iter().map(|p| p.display().to_string()).collect();
            missing(&format!(
                "{name} is not on PATH nor at {}",
                if places.is_empty() {
                    "any fallback location".to_owned()
                } else {
                    places.join(" or ")
                }
            ))
        })
}
