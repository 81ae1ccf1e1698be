#!/usr/bin/env bash
# Redis-backed decisions beside redis-benchmark (see benches/redis.rs). This
# process and redis-benchmark run on core 0, Redis on core 1.
# SECTIONS=flood,leases (of throughput, flood, leases, memory) runs only those.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v taskset >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo bench --features redis --bench redis --no-run
target=${CARGO_TARGET_DIR:-target}
exe=$(ls -t "$target"/release/deps/redis-* | grep -v '\.d$' | head -n1)
taskset -c 0 "$exe" | tee "$target"/bench-redis.md
