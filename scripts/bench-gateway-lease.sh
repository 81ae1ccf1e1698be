#!/usr/bin/env bash
# The gateway on Redis with leases (`--redis-lease auto`) beside the same
# gateway on memory: requests/s in interleaved rounds, loaded by wrk (or
# benches/http_load.rs where wrk is missing) on loopback, one hot key (every request from 127.0.0.1 under `peer_ip`), a
# limit never reached, the upstream an axum hello-world
# (benches/http_server.rs, bare). Prints each round and the ratio of the
# medians.
#
#   scripts/bench-gateway-lease.sh                  # 5 rounds of 5 s
#   ROUNDS=3 DURATION=3s scripts/bench-gateway-lease.sh
#   DIR/bench-gateway-lease.sh   # DIR: tollgate, http_server, http_load and
#                                # redis-server (or valkey-server): no cargo
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
CONNS=${CONNS:-32}
if [ -x "$here/tollgate" ] && [ -x "$here/http_server" ]; then
  # A directory of prebuilt binaries (`bench-cores.sh build DIR`, plus the
  # gateway's `tollgate` and a `redis-server` or `valkey-server`): no cargo.
  gateway=$here/tollgate
  upstream=$here/http_server
  load=$here/http_load
  redis=$(command -v redis-server || ls "$here"/redis-server "$here"/valkey-server 2>/dev/null | head -n 1)
else
  cd "$here/.."
  command -v redis-server >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  }
  cargo build --release --quiet --all-features --bin tollgate --bench http_server --bench http_load
  target=${CARGO_TARGET_DIR:-target}/release
  gateway=$target/tollgate
  upstream=$(ls -t "$target"/deps/http_server-* | grep -v '\.d$' | head -n 1)
  load=$(ls -t "$target"/deps/http_load-* | grep -v '\.d$' | head -n 1)
  redis=$(command -v redis-server)
fi
# On 16 or more CPUs the gateway gets 0-3, the upstream 4-7, the load 8-13
# and Redis 14-15; on fewer, no pinning.
if [ "$(nproc)" -ge 16 ]; then
  pin_gateway="taskset -c 0-3" pin_upstream="taskset -c 4-7"
  pin_load="taskset -c 8-13" pin_redis="taskset -c 14-15" threads=6
else
  pin_gateway="" pin_upstream="" pin_load="" pin_redis="" threads=1
fi
# wrk where installed, else benches/http_load.rs (which reports in wrk's words).
loadgen() {
  if command -v wrk >/dev/null; then
    $pin_load wrk -t"$threads" -c"$CONNS" -d"$1" "$2"
  else
    $pin_load "$load" -t "$threads" -c "$CONNS" -d "${1%s}" "$2"
  fi
}
out=$(mktemp -d)
cat > "$out/rules.yaml" <<'EOF'
rules:
  - name: hot
    key: peer_ip
    quotas: [{ name: hot, algorithm: gcra, limit: 100000000, period: 1h }]
EOF

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"; }
trap cleanup EXIT

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2
  return 1
}

redis_port=$((20000 + RANDOM % 10000))
$pin_redis "$redis" --port "$redis_port" --save "" --appendonly no >/dev/null &
pids+=($!)
up_port=$((30000 + RANDOM % 10000))
MODE=bare PORT=$up_port $pin_upstream "$upstream" &
pids+=($!)
wait_port "$redis_port"
wait_port "$up_port"

printf 'round\tmode\trps\n'
for round in $(seq "$ROUNDS"); do
  for mode in memory redis-lease; do
    port=$((40000 + RANDOM % 10000))
    args=(serve --config "$out/rules.yaml" --listen "127.0.0.1:$port"
      --upstream "http://127.0.0.1:$up_port" --log-level warn)
    if [ "$mode" = redis-lease ]; then
      args+=(--redis "redis://127.0.0.1:$redis_port" --redis-lease auto)
    fi
    $pin_gateway "$gateway" "${args[@]}" &
    pid=$!
    wait_port "$port"
    loadgen 1s "http://127.0.0.1:$port/" >/dev/null
    rps=$(loadgen "$DURATION" "http://127.0.0.1:$port/" |
      sed -n 's/Requests\/sec:[[:space:]]*\([0-9.]*\).*/\1/p')
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    printf '%s\t%s\t%s\n' "$round" "$mode" "$rps" | tee -a "$out/raw.tsv"
  done
done
python3 - "$out/raw.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
by = {}
for _, mode, rps in rows:
    by.setdefault(mode, []).append(float(rps))
mem, lease = statistics.median(by["memory"]), statistics.median(by["redis-lease"])
ratios = [l / m for m, l in zip(by["memory"], by["redis-lease"])]
print(f"median req/s: memory {mem:.0f}, redis lease:auto {lease:.0f}; ratio {lease / mem:.3f}x")
print("per-round ratios: " + ", ".join(f"{r:.3f}" for r in ratios))
PY
