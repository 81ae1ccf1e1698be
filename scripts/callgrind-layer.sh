#!/usr/bin/env bash
# Instructions per request through the layer (memory backend, IETF headers),
# counted by callgrind as the difference between a run of 2N and a run of N
# requests, divided by N: start-up costs cancel and machine noise does not
# enter. Prints the count without a metrics recorder, and with a Prometheus
# recorder installed.
#
#   scripts/callgrind-layer.sh            # N=2000
#   N=10000 scripts/callgrind-layer.sh   # what BENCHMARKS.md reports
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
N=${N:-2000}
cargo build --release --quiet --example layer_instructions
bin="${CARGO_TARGET_DIR:-target}/release/examples/layer_instructions"
count() { # requests, extra args -> instructions
  local out
  if ! out=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1); then
    echo "$out" >&2
    exit 1
  fi
  echo "$out" | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
for mode in none prometheus; do
  extra=()
  [ "$mode" = prometheus ] && extra=(prometheus)
  a=$(count "$N" "${extra[@]}")
  b=$(count $((2 * N)) "${extra[@]}")
  echo "recorder=$mode: $(( (b - a) / N )) instructions per request ($a for $N, $b for $((2 * N)))"
done
