#!/usr/bin/env bash
# The whole test suite and the bar every change must clear: installs redis-server, etcd-server,
# zookeeper (with a JRE) and protobuf-compiler (Debian/Ubuntu, apt) when they are missing, checks formatting, lints,
# docs, the guide (mdbook, installed with cargo when missing), feature combinations and the
# declared minimum Rust version, then runs every test of the workspace. Tests start their own
# redis-server, etcd and ZooKeeper processes on free ports; valgrind (also installed when
# missing) counts the bench's client instructions in its quick run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }

# The servers the tests start themselves (on free ports), and the compiler the etcd client's
# build needs: one apt-get update and one install for whatever is missing.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# The bench's instruction counts (its quick run is a test) run it under callgrind.
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
# The TLS tests' certificates are made with the openssl command (testkit/src/tls.rs).
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# ZooKeeper: Debian's `zookeeper` (the jars, and a JRE through default-jre), which the test kit
# runs as `java -cp /usr/share/java/zookeeper.jar ... QuorumPeerMain`; never `zookeeperd`, the
# package that adds a system service.
{ command -v java >/dev/null 2>&1 && [ -f /usr/share/java/zookeeper.jar ]; } || missing+=(zookeeper)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "not found: ${missing[*]}: installing with apt-get" >&2
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  # redis-server and etcd-server start a system service on install; the tests never use it
  # (each starts its own processes on free ports), so a policy-rc.d that refuses every start
  # keeps it from running (and from holding 2379/2380) while apt installs, when none exists.
  # (`zookeeper` has no service; the same guard covers anything its JRE pulls in.)
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod +x "$policy"
  fi
  $SUDO apt-get update -qq
  status=0
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null || status=$?
  [ -z "$policy" ] || $SUDO rm -f "$policy"
  [ "$status" -eq 0 ] || { echo "apt-get install ${missing[*]} failed ($status)" >&2; exit 1; }
  for binary in redis-server etcd protoc java openssl valgrind; do
    command -v "$binary" >/dev/null 2>&1 || { echo "$binary still missing after apt-get install" >&2; exit 1; }
  done
  [ -f /usr/share/java/zookeeper.jar ] || { echo "/usr/share/java/zookeeper.jar still missing after apt-get install" >&2; exit 1; }
fi
redis-server --version
etcd --version
protoc --version
openssl version
echo "zookeeper $(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo '(not from dpkg)'), $(java -version 2>&1 | head -n 1)"

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
for crate in lock-core lock-macros lock-tower lock-admin; do
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
