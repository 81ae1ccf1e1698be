#!/usr/bin/env bash
# BENCHMARKS.md, "Envoy's rate limit service": ShouldRateLimit decisions per
# second and p99 at 1, 16 and 64 concurrent streams (memory, Redis, Redis
# with leases), then requests per second through Envoy with the rate limit
# filter beside Envoy with none. Needs redis-server and envoy (scripts/test.sh
# installs both). Usage: scripts/bench-rls.sh [SECONDS per run, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-5}"
target="${CARGO_TARGET_DIR:-target}"
cargo build -q --release --features gateway --bin tollgate --example rls_load
bin="$target/release/tollgate"
load="$target/release/examples/rls_load"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# Every call within its limit: what is measured is the decision itself.
cat >"$work/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 4000000000 }
EOF

run_rls() { # label, extra args...
  local label="$1"; shift
  local port; port="$(free_port)"
  "$bin" rls --config "$work/bench.yaml" --listen "127.0.0.1:$port" --log-level error "$@" &
  local pid=$!
  pids+=("$pid")
  wait_port "$port"
  "$load" grpc "127.0.0.1:$port" 1 1 >/dev/null # warm: connections, scripts
  for streams in 1 16 64; do
    echo -n "$label, "
    "$load" grpc "127.0.0.1:$port" "$streams" "$secs"
  done
  echo -n "$label, one hot key, "
  "$load" grpc "127.0.0.1:$port" 64 "$secs" 1
  kill "$pid"
}

redis_port="$(free_port)"
redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >/dev/null &
pids+=($!)
wait_port "$redis_port"

run_rls memory
run_rls redis --redis "redis://127.0.0.1:$redis_port" --redis-timeout 1s
run_rls "redis, leases" --redis "redis://127.0.0.1:$redis_port" --redis-timeout 1s --redis-lease auto

# End to end: Envoy with the filter (tollgate rls on memory) beside Envoy
# with none, to one upstream.
up_port="$(free_port)"
"$load" upstream "127.0.0.1:$up_port" &
pids+=($!)
rls_port="$(free_port)"
"$bin" rls --config "$work/bench.yaml" --listen "127.0.0.1:$rls_port" --log-level error &
pids+=($!)
wait_port "$up_port"
wait_port "$rls_port"

envoy_config() { # listen port, with filter (yes/no)
  local filter="" actions=""
  if [ "$2" = yes ]; then
    actions='
                  rate_limits:
                  - actions:
                    - request_headers: { header_name: x-user, descriptor_key: user }'
    filter='
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              timeout: 2s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: rls } }'
  fi
  cat <<EOF
static_resources:
  listeners:
  - name: main
    address: { socket_address: { address: 127.0.0.1, port_value: $1 } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route:
                  cluster: upstream$actions
          http_filters:$filter
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $up_port } } } }] }]
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: rls
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $rls_port } } } }] }]
EOF
}

for filter in no yes; do
  port="$(free_port)"
  envoy_config "$port" "$filter" >"$work/envoy-$filter.yaml"
  envoy -c "$work/envoy-$filter.yaml" --disable-hot-restart --concurrency 2 -l error &
  pid=$!
  pids+=("$pid")
  wait_port "$port"
  "$load" http "127.0.0.1:$port" 4 1 >/dev/null # warm
  echo -n "envoy, rate limit filter: $filter, "
  "$load" http "127.0.0.1:$port" 16 "$secs"
  kill "$pid"
done
