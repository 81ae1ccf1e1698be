#!/usr/bin/env bash
# BENCHMARKS.md, "Envoy's rate limit service": ShouldRateLimit decisions per
# second and p99 at 1, 16 and 64 concurrent streams (memory, Redis, Redis
# with leases), then requests per second through Envoy with the rate limit
# filter beside Envoy with none. Needs redis-server and envoy (scripts/test.sh
# installs both).
#
# With LIMITADOR=path/to/limitador-server (Kuadrant's RLS server, built from
# its repository: nothing of it is in this one), the same load also runs
# against it (memory, redis, and redis_cached as its counterpart of leases)
# and a table of both with ratios ends the output.
#
# With BIN_DIR=dir, nothing is built: the binaries come from dir (tollgate,
# rls_load, limitador-server when there and LIMITADOR is unset, and
# redis-server, redis-cli and envoy when there, else from PATH), with the
# shared libraries in dir/lib; the end-to-end part is left out when no envoy
# is found. `BIN_DIR=dir scripts/bench-rls.sh --collect` builds and fills
# dir so, for a machine without cargo (python3 and bash are still needed).
#
# ROUNDS=n measures every row n times (interleaved) and the table shows
# the median of each.
#
# Usage: [LIMITADOR=...] [BIN_DIR=...] [ROUNDS=n] scripts/bench-rls.sh [SECONDS per run, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bin_dir="${BIN_DIR:-}"

if [ "${1:-}" = --collect ]; then
  [ -n "$bin_dir" ] || { echo "--collect needs BIN_DIR=dir" >&2; exit 2; }
  cargo build -q --release --features gateway --bin tollgate --bench rls_load
  mkdir -p "$bin_dir/lib"
  cp "$target/release/tollgate" "$bin_dir/tollgate"
  cp "$(ls -t "$target"/release/deps/rls_load-* | grep -v '\.d$' | head -n 1)" "$bin_dir/rls_load"
  programs=("$bin_dir/tollgate" "$bin_dir/rls_load")
  for p in "${LIMITADOR:-}" "$(command -v redis-server)" "$(command -v redis-cli)" \
    "$(python3 -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))' 2>/dev/null || true)"; do
    [ -n "$p" ] && [ -x "$p" ] || continue
    cp "$p" "$bin_dir/$(basename "$p")"
    programs+=("$bin_dir/$(basename "$p")")
  done
  strip "${programs[@]}" 2>/dev/null || true
  # Every library they load but the C library's own, which the machine has.
  ldd "${programs[@]}" 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$bin_dir/lib/"; done
  du -sh "$bin_dir"
  exit 0
fi

secs="${1:-5}"
rounds="${ROUNDS:-1}"
if [ -n "$bin_dir" ]; then
  bin_dir="$(cd "$bin_dir" && pwd)"
  export PATH="$bin_dir:$PATH" LD_LIBRARY_PATH="$bin_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  bin="$bin_dir/tollgate"
  load="$bin_dir/rls_load"
  if [ -z "${LIMITADOR:-}" ] && [ -x "$bin_dir/limitador-server" ]; then
    LIMITADOR="$bin_dir/limitador-server"
  fi
else
  cargo build -q --release --features gateway --bin tollgate --bench rls_load
  bin="$target/release/tollgate"
  load=$(ls -t "$target"/release/deps/rls_load-* | grep -v '\.d$' | head -n 1)
fi
limitador="${LIMITADOR:-}"
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

# The same limit for limitador: namespace = domain, one counter per user.
cat >"$work/limitador.yaml" <<'EOF'
- namespace: bench
  max_value: 4000000000
  seconds: 86400
  conditions: []
  variables: ["descriptors[0].user"]
EOF

results="$work/results"
: >"$results"

one_row() { # server, storage, streams, port
  local server="$1" storage="$2" streams="$3" port="$4" line
  if [ "$streams" = hot ]; then
    line="$("$load" grpc "127.0.0.1:$port" 64 "$secs" 1)"
  else
    line="$("$load" grpc "127.0.0.1:$port" "$streams" "$secs")"
  fi
  echo "$server, $storage, $streams: $line"
  echo "$server|$storage|$streams|$line" >>"$results"
}

start_tollgate() { # extra args...; sets port and pid
  port="$(free_port)"
  "$bin" rls --config "$work/bench.yaml" --listen "127.0.0.1:$port" --log-level error "$@" &
  pid=$!
  pids+=("$pid")
  wait_port "$port"
}

start_limitador() { # storage args...; sets port and pid
  port="$(free_port)"
  "$limitador" --rls-ip 127.0.0.1 --rls-port "$port" --http-ip 127.0.0.1 --http-port "$(free_port)" \
    "$work/limitador.yaml" "$@" >>"$work/limitador.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_port "$port"
}

# One storage: tollgate (and limitador) serving side by side, each row
# measured on one then the other, ROUNDS times, so that the load of the
# machine drifting over the run weighs on both alike.
run_storage() { # storage, "tollgate args", "limitador args"
  local storage="$1" t_port t_pid l_port="" l_pid="" streams round
  redis-cli -p "$redis_port" flushall >/dev/null
  # shellcheck disable=SC2086 # the args are words
  start_tollgate $2
  t_port="$port" t_pid="$pid"
  "$load" grpc "127.0.0.1:$t_port" 1 1 >/dev/null # warm: connections, scripts
  if [ -n "$limitador" ]; then
    # shellcheck disable=SC2086
    start_limitador $3
    l_port="$port" l_pid="$pid"
    "$load" grpc "127.0.0.1:$l_port" 1 1 >/dev/null
  fi
  for round in $(seq "$rounds"); do
    for streams in 1 16 64 hot; do
      one_row tollgate "$storage" "$streams" "$t_port"
      [ -z "$l_port" ] || one_row limitador "$storage" "$streams" "$l_port"
    done
  done
  kill "$t_pid" ${l_pid:+"$l_pid"}
}

redis_port="$(free_port)"
redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >/dev/null &
pids+=($!)
wait_port "$redis_port"

redis_url="redis://127.0.0.1:$redis_port"
run_storage memory "" memory
run_storage redis "--redis $redis_url --redis-timeout 1s" "redis $redis_url"
run_storage "redis, leases" "--redis $redis_url --redis-timeout 1s --redis-lease auto" \
  "redis_cached $redis_url"

# End to end: Envoy with the filter (tollgate rls on memory) beside Envoy
# with none, to one upstream.
if ! command -v envoy >/dev/null; then
  echo "envoy not found: the end-to-end part is left out"
else
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
fi

if [ -n "$limitador" ]; then
  echo
  python3 - "$results" <<'EOF'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    server, storage, streams, out = line.rstrip("\n").split("|", 3)
    m = re.search(r"([0-9]+)/s p50 [0-9]+ us p99 ([0-9]+) us .*errors ([0-9]+)", out)
    rows.setdefault((server, storage, streams), []).append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
def median(runs):
    # Of each column apart, the median run (the lower of the two middle ones).
    pick = lambda i: sorted(r[i] for r in runs)[(len(runs) - 1) // 2]
    return (pick(0), pick(1), sum(r[2] for r in runs))
runs = rows
rows = {k: median(v) for k, v in rows.items()}
def spread(t, l):
    # The ratio in each round (rows are interleaved round by round).
    ratios = sorted(a[0] / b[0] for a, b in zip(t, l))
    return f"{ratios[0]:.2f}x to {ratios[-1]:.2f}x" if len(ratios) > 1 else ""
def cell(r):
    text = f"{r[0]:,} ({r[1] / 1000:.1f} ms)".replace(",", " ")
    return text + (f", {r[2]} errors" if r[2] else "")
print("| ShouldRateLimit, decisions/s (p99) | tollgate rls | limitador | tollgate / limitador | per round |")
print("|---|---|---|---|---|")
for storage in ["memory", "redis", "redis, leases"]:
    for streams in ["1", "16", "64", "hot"]:
        t, l = rows.get(("tollgate", storage, streams)), rows.get(("limitador", storage, streams))
        if not t or not l:
            continue
        what = "64 streams, one hot key" if streams == "hot" else f"{streams} stream" + ("s" if streams != "1" else "")
        across = spread(runs[("tollgate", storage, streams)], runs[("limitador", storage, streams)])
        print(f"| {storage}, {what} | {cell(t)} | {cell(l)} | {t[0] / l[0]:.2f}x | {across} |")
EOF
fi
