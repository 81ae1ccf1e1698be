#!/usr/bin/env bash
# Instructions per request through the layer (memory backend, IETF headers),
# counted by callgrind as the difference between a run of 2N and a run of N
# requests, divided by N: start-up costs cancel and machine noise does not
# enter. Only the request loop is counted (`--toggle-collect`), after one
# uncounted request: the clock's calibration on the first request loops for
# a span of wall time, so its count differs from run to run and did not
# cancel (the difference moved by thousands per request between runs). Prints
# the count for a bare service, tollgate's layer and tower_governor's (headers
# on) without a metrics recorder, what each layer adds to bare, and
# tollgate's count with a Prometheus recorder installed; beside each, the
# misses of callgrind's model of this machine's L1 instruction cache (they
# follow where the code lands, so they move between builds).
#
#   scripts/callgrind-layer.sh            # N=2000
#   N=10000 scripts/callgrind-layer.sh   # what BENCHMARKS.md reports
#   FEATURES=rules scripts/callgrind-layer.sh   # and the same quota as a rules file
#   BIN=DIR/layer_instructions scripts/callgrind-layer.sh   # a bench built elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
N=${N:-2000}
if [ -n "${BIN:-}" ]; then
  bin=$BIN # another build's bench, to compare two commits
else
  cargo build --release --quiet --features "${FEATURES:-}" --bench layer_instructions
  bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/layer_instructions-* | grep -v '\.d$' | head -n 1)
fi
count() { # requests, extra args -> "instructions instruction-cache-misses"
  local out
  if ! out=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no \
    --cache-sim=yes '--toggle-collect=*layer_instructions::counted*' "$bin" "$@" 2>&1); then
    echo "$out" >&2
    exit 1
  fi
  # The events: Ir Dr Dw I1mr ... (callgrind's cache model of this machine).
  echo "$out" | sed -n 's/.*Collected : \([0-9]*\) [0-9]* [0-9]* \([0-9]*\).*/\1 \2/p'
}
per_request() { # args -> "instructions misses", per request
  local a a_miss b b_miss
  read -r a a_miss <<<"$(count "$N" "$@")"
  read -r b b_miss <<<"$(count $((2 * N)) "$@")"
  echo "$(( (b - a) / N )) $(( (b_miss - a_miss) / N ))"
}
read -r bare bare_miss <<<"$(per_request bare)"
read -r tollgate tollgate_miss <<<"$(per_request tollgate)"
read -r governor governor_miss <<<"$(per_request governor)"
read -r prometheus prometheus_miss <<<"$(per_request tollgate prometheus)"
read -r plain plain_miss <<<"$(per_request tollgate-no-headers)"
echo "| service | instructions per request | added by the layer | instruction-cache misses per request |"
echo "|---|---:|---:|---:|"
echo "| bare | $bare | | $bare_miss |"
echo "| tollgate (memory, IETF headers) | $tollgate | $((tollgate - bare)) | $tollgate_miss |"
echo "| tower_governor (headers on) | $governor | $((governor - bare)) | $governor_miss |"
echo "| tollgate, Prometheus recorder installed | $prometheus | $((prometheus - bare)) | $prometheus_miss |"
echo "| tollgate, no rate-limit headers | $plain | $((plain - bare)) | $plain_miss |"
if [[ "${FEATURES:-}" == *rules* ]]; then
  read -r rules rules_miss <<<"$(per_request rules)"
  echo "| tollgate, the quota as a rules file | $rules | $((rules - bare)) | $rules_miss |"
fi
python3 -c "print(f'tollgate adds {($tollgate - $bare) / ($governor - $bare):.2f}x what tower_governor adds')"
