#!/usr/bin/env bash
# The whole test suite and the bar every change must clear: installs redis-server (Debian/Ubuntu,
# apt) when it is missing, checks formatting, lints, docs, the guide (mdbook, installed with cargo
# when missing), feature combinations and the declared
# minimum Rust version, then runs every test of the workspace. Tests start their own
# redis-server processes on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found: installing it with apt-get" >&2
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq redis-server >/dev/null
  # The package may start a system service; the tests never use it (they start their own).
  command -v redis-server >/dev/null 2>&1 || { echo "redis-server still missing after apt-get install" >&2; exit 1; }
fi
redis-server --version

step "formatting: cargo fmt --check"
cargo fmt --all -- --check

step "lints: clippy on every target and feature, warnings denied"
# clippy also checks std APIs against the declared rust-version (clippy::incompatible_msrv).
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "docs: broken intra-doc links denied"
RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links" \
  cargo doc --workspace --no-deps --all-features --quiet

step "guide: mdbook build docs (its examples run as lock-tests doctests, its links in tests/docs.rs)"
if ! command -v mdbook >/dev/null 2>&1; then
  echo "mdbook not found: installing it with cargo install" >&2
  cargo install mdbook --version 0.5.4 --locked --no-default-features --features search
fi
mdbook build docs --dest-dir "$PWD/target/book"

step "features: each crate with its default features off, and with each feature alone"
# The features are read from each manifest's [features] table, so a new one is never skipped.
features_of() {
  sed -n '/^\[features\]/,/^\[/p' "$1/Cargo.toml" | sed -n 's/^\([A-Za-z0-9_-]*\) *=.*/\1/p' | grep -vx default || true
}
for crate in lock-core lock-macros lock-tower; do
  cargo check --quiet -p "$crate" --no-default-features
  for feature in $(features_of "$crate"); do
    echo "$crate: --no-default-features --features $feature" >&2
    cargo check --quiet -p "$crate" --no-default-features --features "$feature"
  done
done

msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
step "minimum Rust version: the workspace builds with rustc $msrv (rust-version)"
if ! command -v rustup >/dev/null 2>&1; then
  echo "rustup is missing: cannot install rustc $msrv; install rustup, or run this on a machine with it" >&2
  exit 1
fi
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  rustup toolchain install "$msrv" --profile minimal
fi
# A target directory of its own: the toolchains' artifacts never mix.
CARGO_TARGET_DIR=target/msrv cargo +"$msrv" check --quiet --workspace --all-targets --all-features

step "tests: every test of the workspace"
cargo test --workspace --all-features --no-fail-fast
