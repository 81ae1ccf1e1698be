#!/usr/bin/env bash
# HTTP overhead of rate limiting: an axum hello-world bare, behind tollgate
# (memory; a per-IP key, a global key, a global key batched per core), behind
# tower_governor, and (with REDIS=1) behind tollgate on Redis. Runs are
# interleaved round by round, the server pinned to SERVER_CPUS and the load
# generator to LOAD_CPUS, and the report gives each configuration as a ratio
# to bare from the same run, and the server's CPU time per request (user +
# system, from /proc/PID/stat over the measured run): on a shared machine,
# time the server spends per request moves less than requests per second,
# since waiting for the CPU is not counted (BENCHMARKS.md, "Over HTTP").
#
# The load generator is wrk where installed (LOADGEN=wrk), else
# benches/http_load.rs (LOADGEN=rust), which reports in wrk's words.
#
#   scripts/bench-http.sh                 # build, then 5 rounds of 10 s per configuration
#   ROUNDS=3 DURATION=5s scripts/bench-http.sh
#   MODES="bare passthrough tollgate-unkeyed tollgate" scripts/bench-http.sh
#                                         # other modes: benches/http_server.rs
#   scripts/bench-cores.sh build DIR      # release binaries and these scripts in DIR;
#   DIR/bench-http.sh                     # then there: no cargo, no network
#
# On 16 or more CPUs the server gets CPUs 0-7 and the load 8-15 (8 threads);
# on fewer, CPU 0 and CPU 1. Set SERVER_CPUS, LOAD_CPUS, LOAD_THREADS, CONNS
# to choose. Writes report.md in OUT (target/bench-http, or DIR/out/http) and
# the chart beside it (bench-http.svg).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# The path of a release target's executable, as cargo reports it.
built() {
  grep -o '"executable":"[^"]*"' | grep "$1" | tail -n1 | sed 's/.*:"//; s/"$//'
}

if [ -x "$here/http_server" ]; then
  # A directory made by `bench-cores.sh build`.
  bin=$here
  out=${OUT:-$here/out/http}
  svg=$out/bench-http.svg
else
  cd "$here/.."
  features=""
  if [ "${REDIS:-0}" = 1 ]; then features="--features redis"; fi
  # The harnesses are bench targets, whose files cargo names with a hash:
  # copied under their own names, as `bench-cores.sh build` does.
  bin=${CARGO_TARGET_DIR:-target}/bench-http-bin
  mkdir -p "$bin"
  json=$(cargo build --release --bench http_server --bench http_load $features --message-format=json)
  cp "$(echo "$json" | built /http_server-)" "$bin/http_server"
  cp "$(echo "$json" | built /http_load-)" "$bin/http_load"
  out=${OUT:-target/bench-http}
  svg=$out/bench-http.svg
fi

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
MODES=${MODES:-"bare tollgate tollgate-global tollgate-global-batched governor"}
if [ "$(nproc)" -ge 16 ]; then
  SERVER_CPUS=${SERVER_CPUS:-0-7}
  LOAD_CPUS=${LOAD_CPUS:-8-15}
  LOAD_THREADS=${LOAD_THREADS:-8}
else
  SERVER_CPUS=${SERVER_CPUS:-0}
  LOAD_CPUS=${LOAD_CPUS:-1}
  LOAD_THREADS=${LOAD_THREADS:-1}
fi
CONNS=${CONNS:-$((LOAD_THREADS * 64))}
LOADGEN=${LOADGEN:-$(command -v wrk >/dev/null && echo wrk || echo rust)}
if [ "${REDIS:-0}" = 1 ]; then
  MODES="$MODES tollgate-redis tollgate-redis-lease"
  command -v redis-server >/dev/null || { echo "REDIS=1 needs redis-server" >&2; exit 1; }
fi
command -v taskset >/dev/null || { echo "needs taskset (util-linux)" >&2; exit 1; }

load() {
  if [ "$LOADGEN" = wrk ]; then
    taskset -c "$LOAD_CPUS" wrk -t"$LOAD_THREADS" -c"$CONNS" -d"$1" --latency "$2"
  else
    taskset -c "$LOAD_CPUS" "$bin/http_load" -t "$LOAD_THREADS" -c "$CONNS" -d "$1" "$2"
  fi
}

mkdir -p "$out"
printf 'mode\tround\trps\tp99_ms\tcpu_us\tuser_us\tsys_us\n' > "$out/raw.tsv"
echo "server on CPUs $SERVER_CPUS, $LOADGEN on CPUs $LOAD_CPUS ($LOAD_THREADS threads, $CONNS connections)"

redis_pid=""
server_pid=""
if [ "${REDIS:-0}" = 1 ]; then
  redis_port=$((20000 + RANDOM % 10000))
  taskset -c "$LOAD_CPUS" redis-server --port "$redis_port" --save "" --appendonly no --daemonize no >/dev/null &
  redis_pid=$!
  export REDIS_URL="redis://127.0.0.1:$redis_port"
fi
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null
  true
}
trap cleanup EXIT

# The server's user and system CPU time so far, all threads, in clock ticks:
# fields 14 and 15 of /proc/PID/stat, counted after the ")" that ends the
# command name (which may hold spaces).
cpu_ticks() {
  sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12, $13 }'
}

# Starts the server in $mode on a free port: sets server_pid and port. A
# port taken meanwhile makes the server exit: then another port.
start_server() {
  for _ in $(seq 10); do
    port=$((30000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    MODE=$mode PORT=$port taskset -c "$SERVER_CPUS" "$bin/http_server" &
    server_pid=$!
    for _ in $(seq 200); do
      kill -0 "$server_pid" 2>/dev/null || break
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
      sleep 0.05
    done
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  done
  echo "$mode: the server did not start" >&2
  return 1
}

hz=$(getconf CLK_TCK)
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    start_server
    load 2s "http://127.0.0.1:$port/" >/dev/null
    read -r user_before sys_before <<<"$(cpu_ticks "$server_pid")"
    load "$DURATION" "http://127.0.0.1:$port/" > "$out/$mode-$round.txt"
    read -r user_after sys_after <<<"$(cpu_ticks "$server_pid")"
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    # requests/s, p99 in ms, CPU per request in microseconds (total, user,
    # system), in awk so that the target needs no Python.
    awk -v mode="$mode" -v round="$round" -v hz="$hz" \
        -v user=$((user_after - user_before)) -v sys=$((sys_after - sys_before)) '
      /Requests\/sec:/ { rps = $2 }
      /requests in/ { requests = $1 }
      /^ *99%/ { v = $2; unit = v; sub(/[a-z]+$/, "", v); sub(/^[0-9.]+/, "", unit)
                 p99 = v * (unit == "us" ? 0.001 : unit == "s" ? 1000 : 1) }
      /Non-2xx or 3xx responses:/ { bad = $NF }
      END {
        if (bad > 0) { print mode ": " bad " responses were not 200; the limit must never be reached" > "/dev/stderr"; exit 1 }
        if (requests == 0) { print mode ": no requests" > "/dev/stderr"; exit 1 }
        u = user / hz * 1e6 / requests; s = sys / hz * 1e6 / requests
        printf "%s\t%s\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\n", mode, round, rps, p99, u + s, u, s
      }' "$out/$mode-$round.txt" >> "$out/raw.tsv"
    IFS=$'\t' read -r _ _ rps p99 cpu _ <<<"$(tail -n1 "$out/raw.tsv")"
    echo "round $round $mode: $rps req/s, p99 $p99 ms, $cpu us CPU per request"
  done
done

if command -v python3 >/dev/null; then
  python3 "$here/bench_report.py" "$out/raw.tsv" "$svg" > "$out/report.md"
else
  # Means over rounds, and ratios to bare.
  awk -F'\t' 'NR > 1 { n[$1]++; r[$1] += $3; c[$1] += $5; if (!($1 in seen)) { seen[$1]; order[++k] = $1 } }
    END { print "| server | requests/s | vs bare | CPU us/request | added |"; print "|---|---:|---:|---:|---:|"
          for (i = 1; i <= k; i++) { m = order[i]
            printf "| %s | %.0f | %.3f | %.3f | %.3f |\n", m, r[m]/n[m], (r[m]/n[m]) / (r["bare"]/n["bare"]), c[m]/n[m], c[m]/n[m] - c["bare"]/n["bare"] } }' \
    "$out/raw.tsv" > "$out/report.md"
fi
cat "$out/report.md"
