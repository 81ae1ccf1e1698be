#!/usr/bin/env bash
# Waiting one's turn (benches/outbound_load.rs): tollgate's pacer in memory
# and on a Redis started here, beside governor's until_key_ready. Prints a
# Markdown table (BENCHMARKS.md, "Outbound: waiting one's turn").
# PROFILE=debug runs the debug build (no release build of the dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no >/dev/null &
redis=$!
trap 'kill $redis; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
release=--release
[ "${PROFILE:-release}" = debug ] && release=
bin=$(cargo build -q $release --features redis --bench outbound_load --message-format=json |
  grep -o '"executable":"[^"]*outbound_load[^"]*"' | tail -n1 | sed 's/.*:"//; s/"$//')
"$bin" \
  --redis "redis://127.0.0.1:$port" --rate "${RATE:-200}" --seconds "${SECONDS_EACH:-3}"
