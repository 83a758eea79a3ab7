#!/usr/bin/env bash
# The whole test suite: installs redis-server (Debian/Ubuntu, apt) when it is missing, then runs
# every test of the workspace. Tests start their own redis-server processes on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

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

cargo test --workspace --all-features --no-fail-fast
