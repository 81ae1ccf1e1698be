#!/usr/bin/env bash
# The gateway on Redis with leases (`--redis-lease auto`) beside the same
# gateway on memory: requests/s in interleaved rounds, loaded by wrk on
# loopback, one hot key (every request from 127.0.0.1 under `peer_ip`), a
# limit never reached, the upstream an axum hello-world
# (benches/http_server.rs, bare). Prints each round and the ratio of the
# medians.
#
#   scripts/bench-gateway-lease.sh                  # 5 rounds of 5 s
#   ROUNDS=3 DURATION=3s scripts/bench-gateway-lease.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
CONNS=${CONNS:-32}
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v redis-server >/dev/null || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release --quiet --all-features --bin tollgate --bench http_server
target=${CARGO_TARGET_DIR:-target}/release
upstream=$(ls -t "$target"/deps/http_server-* | grep -v '\.d$' | head -n 1)
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
redis-server --port "$redis_port" --save "" --appendonly no >/dev/null &
pids+=($!)
up_port=$((30000 + RANDOM % 10000))
MODE=bare PORT=$up_port "$upstream" &
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
    "$target/tollgate" "${args[@]}" &
    pid=$!
    wait_port "$port"
    wrk -t1 -c"$CONNS" -d1s "http://127.0.0.1:$port/" >/dev/null
    rps=$(wrk -t1 -c"$CONNS" -d"$DURATION" "http://127.0.0.1:$port/" |
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
