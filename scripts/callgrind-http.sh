#!/usr/bin/env bash
# What a real HTTP server spends per request, counted rather than timed: the
# axum hello-world of benches/http_server.rs, bare, behind tollgate and
# behind tower_governor, runs under callgrind while curl sends N and then
# 5N requests one after another on one keep-alive connection; the
# difference of the two counts over 4N is the server's user-space
# instructions per request (hyper, axum, the layer), so start-up, the
# clock's calibration and machine noise cancel. strace counts the system
# calls per request the same way: the kernel's share of the CPU time that
# scripts/bench-http.sh measures. On a shared 2-core VM, where that time
# moves by several microseconds a request between rounds, these counts are
# what settle one layer against another.
#
#   scripts/callgrind-http.sh                         # N=1000
#   N=2000 MODES="bare tollgate tollgate-global governor" scripts/callgrind-http.sh
#   BIN=DIR/http_server scripts/callgrind-http.sh     # a server built elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind strace curl; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
N=${N:-1000}
MODES=${MODES:-"bare tollgate governor"}
if [ -n "${BIN:-}" ]; then
  bin=$BIN # another build's server, to compare two commits
else
  json=$(cargo build --release --bench http_server --message-format=json)
  bin=$(echo "$json" | grep -o '"executable":"[^"]*http_server-[^"]*"' | tail -n1 | sed 's/.*:"//; s/"$//')
fi
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

# Runs the server in MODE under TOOL (callgrind or strace) for `requests`
# requests after one warm-up request; prints the tool's total.
measure() { # tool mode requests
  local tool=$1 mode=$2 requests=$3 port
  port=$((30000 + RANDOM % 20000))
  case $tool in
    callgrind) MODE=$mode PORT=$port valgrind --tool=callgrind --callgrind-out-file="$work/cg" \
                 "$bin" 2>/dev/null & ;;
    strace) MODE=$mode PORT=$port strace -f -c -o "$work/out" "$bin" 2>/dev/null & ;;
  esac
  pid=$!
  for _ in $(seq 300); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/" && break
    kill -0 "$pid" 2>/dev/null || { echo "$mode: the server did not start" >&2; exit 1; }
    sleep 0.1
  done
  # Counted from here: the first request calibrates the clock, which
  # loops for a span of wall time, so its count differs from run to run.
  [ "$tool" = callgrind ] && callgrind_control -z "$pid" >/dev/null 2>&1
  # One connection, requests one after another; any status but 200 fails.
  curl -sf -o /dev/null "http://127.0.0.1:$port/?[1-$requests]"
  [ "$tool" = callgrind ] && callgrind_control -d "$pid" >/dev/null 2>&1
  # The server itself: strace, given its own output file, blocks the
  # signals that would stop it, and reports once the server is gone.
  kill -TERM "$(pgrep -P "$pid" || echo "$pid")"
  wait "$pid" 2>/dev/null || true
  pid=""
  case $tool in
    callgrind) sed -n 's/^totals: \([0-9]*\).*/\1/p' "$work/cg.1"; rm -f "$work"/cg* ;;
    strace) awk '$NF == "total" { print $4 }' "$work/out" ;;
  esac
}

per_request() { # tool mode
  local a b
  a=$(measure "$1" "$2" "$N")
  b=$(measure "$1" "$2" $((5 * N)))
  awk -v a="$a" -v b="$b" -v n=$((4 * N)) 'BEGIN { printf "%.1f", (b - a) / n }'
}

printf '| server | instructions per request | added to bare | system calls per request |\n'
printf '|---|---:|---:|---:|\n'
bare=""
for mode in $MODES; do
  instructions=$(per_request callgrind "$mode")
  syscalls=$(per_request strace "$mode")
  [ -z "$bare" ] && bare=$instructions
  added=$(awk -v i="$instructions" -v b="$bare" 'BEGIN { printf "%+.0f", i - b }')
  printf '| %s | %.0f | %s | %s |\n' "$mode" "$instructions" "$added" "$syscalls"
done
