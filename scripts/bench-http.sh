#!/usr/bin/env bash
# HTTP overhead of rate limiting: an axum hello-world bare, behind tollgate
# (memory), behind tower_governor, and (with REDIS=1) behind tollgate on
# Redis, loaded by wrk on loopback. Runs are interleaved round by round, the
# server pinned to one core and wrk to the other, and the report gives each
# configuration as a ratio to bare from the same run, and the server's CPU
# time per request (user + system, from /proc/PID/stat over the measured
# run): on a shared machine, time the server spends per request moves less
# than requests per second, since waiting for the CPU is not counted. User
# and system time are also reported apart: the layers' own work is user
# time, and the kernel's share moves with how the server and wrk take turns
# (BENCHMARKS.md, "Over HTTP").
#
#   scripts/bench-http.sh                 # 5 rounds of 10 s per configuration
#   ROUNDS=3 DURATION=5s scripts/bench-http.sh
#   MODES="bare passthrough tollgate-unkeyed tollgate" scripts/bench-http.sh
#                                         # other modes: examples/bench_server.rs
#
# Writes target/bench-http/report.md and docs/bench-http.svg.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
MODES=${MODES:-"bare tollgate governor"}
features=""
if [ "${REDIS:-0}" = 1 ]; then
  MODES="$MODES tollgate-redis tollgate-redis-lease"
  features="--features redis"
fi

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v taskset >/dev/null || need+=(util-linux)
if [ "${REDIS:-0}" = 1 ]; then command -v redis-server >/dev/null || need+=(redis-server); fi
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo build --release --example bench_server $features
server=target/release/examples/bench_server
out=target/bench-http
mkdir -p "$out" docs
printf 'mode\tround\trps\tp99_ms\tcpu_us\tuser_us\tsys_us\n' > "$out/raw.tsv"

redis_pid=""
if [ "${REDIS:-0}" = 1 ]; then
  redis_port=$((20000 + RANDOM % 10000))
  taskset -c 1 redis-server --port "$redis_port" --save "" --appendonly no --daemonize no >/dev/null &
  redis_pid=$!
  export REDIS_URL="redis://127.0.0.1:$redis_port"
fi
cleanup() { [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true; }
trap cleanup EXIT

# The server's user and system CPU time so far, all threads, in clock ticks.
cpu_ticks() {
  # Fields 14 and 15 of /proc/PID/stat, counted after the ")" that ends the
  # command name (which may hold spaces).
  sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12, $13 }'
}

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "server on port $1 did not start" >&2
  return 1
}

for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    port=$((30000 + RANDOM % 20000))
    MODE=$mode PORT=$port taskset -c 0 "$server" &
    pid=$!
    wait_port "$port"
    # Warm up, then measure.
    taskset -c 1 wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$port/" >/dev/null
    cpu_before=$(cpu_ticks "$pid")
    taskset -c 1 wrk -t1 -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$port/" > "$out/$mode-$round.txt"
    cpu_after=$(cpu_ticks "$pid")
    read -r user_before sys_before <<<"$cpu_before"
    read -r user_after sys_after <<<"$cpu_after"
    echo "cpu_ticks $((user_after - user_before)) $((sys_after - sys_before)) $(getconf CLK_TCK)" >> "$out/$mode-$round.txt"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    python3 - "$out/$mode-$round.txt" "$mode" "$round" >> "$out/raw.tsv" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
v, unit = re.search(r"99%\s+([\d.]+)(us|ms|s)", text).groups()
p99 = float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
requests = int(re.search(r"(\d+) requests in", text).group(1))
user, system, hz = map(int, re.search(r"cpu_ticks (\d+) (\d+) (\d+)", text).groups())
user_us, sys_us = (t / hz * 1e6 / requests for t in (user, system))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
if non2xx:
    sys.exit(f"{sys.argv[2]}: {non2xx.group(1)} responses were not 200; the limit must never be reached")
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{rps:.0f}\t{p99:.3f}\t{user_us + sys_us:.3f}\t{user_us:.3f}\t{sys_us:.3f}")
PY
    echo "round $round $mode: $(tail -n1 "$out/raw.tsv" | cut -f3) req/s, p99 $(tail -n1 "$out/raw.tsv" | cut -f4) ms, $(tail -n1 "$out/raw.tsv" | cut -f5) us CPU per request"
  done
done

python3 scripts/bench_report.py "$out/raw.tsv" docs/bench-http.svg > "$out/report.md"
cat "$out/report.md"
