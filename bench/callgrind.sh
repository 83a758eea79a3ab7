#!/usr/bin/env bash
# Client instructions per uncontended lock + release cycle, counted by callgrind (the same count
# however busy the machine is), for ours, the seed design and rslock: the bench's
# `instructions` section, with its profiles kept under target/callgrind/ for callgrind_annotate.
#
#   bash bench/callgrind.sh [--quick]
#
# The bench runs `lock-bench --cycles` under callgrind twice per design and shape, with N and
# 3N cycles, and reports the difference of the two totals over 2N: start-up, connecting and the
# warm-up cancel out (see the section's Method in BENCHMARKS.md). It starts its own redis-server
# on a free port (not counted). Builds lock-bench in release with line tables
# (CARGO_PROFILE_RELEASE_DEBUG=line-tables-only) so that the profiles can be read by function
# and line: `callgrind_annotate --inclusive=yes target/callgrind/ours-6000-1x1.out`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }

export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo build --release --quiet -p lock-bench
mkdir -p target/callgrind
LOCK_BENCH_CALLGRIND_DIR="$PWD/target/callgrind" target/release/lock-bench "$@" --only instructions
