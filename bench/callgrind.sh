#!/usr/bin/env bash
# Client instructions per uncontended lock + release cycle, counted by callgrind (the same count
# however busy the machine is), for ours, ours without the watchdog, the seed design and rslock.
#
#   bench/callgrind.sh [DESIGN ...]        (default: ours ours-nowd seed rslock)
#
# Each design runs `lock-bench --cycles` twice under callgrind, with N and 3N cycles, and the
# figure is the difference of the two totals over 2N: start-up, connecting and the warm-up
# cancel out. Two shapes: 1 task on 1 key, and 16 tasks x 4 keys of their own; a current-thread
# runtime; every thread of the client counted. The redis-server (started here on a free port,
# no persistence) is not counted. Needs valgrind and redis-server; builds lock-bench in release
# with line tables (CARGO_PROFILE_RELEASE_DEBUG=line-tables-only) so that the profiles it keeps
# under target/callgrind/ can be read with callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }

designs=("$@")
[ "${#designs[@]}" -gt 0 ] || designs=(ours ours-nowd seed rslock)

export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo build --release --quiet -p lock-bench
bin="$PWD/target/release/lock-bench"
out="$PWD/target/callgrind"
mkdir -p "$out"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --save '' --appendonly no --bind 127.0.0.1 --daemonize no >"$out/redis.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export REDIS_URL="redis://127.0.0.1:$port/"

# Total instructions of one run: design, cycles, tasks, keys.
count() {
  local name="$1-$2-$3x$4"
  valgrind --tool=callgrind --callgrind-out-file="$out/$name.out" "$bin" --cycles "$1" "$2" "$3" "$4" \
    2>"$out/$name.log" >/dev/null
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/$name.log"
}

printf '| design | shape | instructions per cycle |\n|---|---|---|\n'
for design in "${designs[@]}"; do
  for shape in "1 1 2000" "16 4 3200"; do
    read -r tasks keys n <<<"$shape"
    a=$(count "$design" "$n" "$tasks" "$keys")
    b=$(count "$design" $((3 * n)) "$tasks" "$keys")
    printf '| %s | %s task(s) x %s key(s) | %s |\n' "$design" "$tasks" "$keys" $(((b - a) / (2 * n)))
  done
done
