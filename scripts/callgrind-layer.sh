#!/usr/bin/env bash
# Instructions per request through the layer (memory backend, IETF headers),
# counted by callgrind as the difference between a run of 2N and a run of N
# requests, divided by N: start-up costs cancel and machine noise does not
# enter. Only the request loop is counted (`--toggle-collect`), after one
# uncounted request: the clock's calibration on the first request loops for
# a span of wall time, so its count differs from run to run and did not
# cancel (the difference moved by thousands per request between runs). Prints the count for a bare service, tollgate's layer and
# tower_governor's (headers on) without a metrics recorder, what each layer
# adds to bare, and tollgate's count with a Prometheus recorder installed.
#
#   scripts/callgrind-layer.sh            # N=2000
#   N=10000 scripts/callgrind-layer.sh   # what BENCHMARKS.md reports
#   FEATURES=rules scripts/callgrind-layer.sh   # and the same quota as a rules file
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
N=${N:-2000}
cargo build --release --quiet --features "${FEATURES:-}" --bench layer_instructions
bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/layer_instructions-* | grep -v '\.d$' | head -n 1)
count() { # requests, extra args -> instructions
  local out
  if ! out=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no \
    '--toggle-collect=*layer_instructions::counted*' "$bin" "$@" 2>&1); then
    echo "$out" >&2
    exit 1
  fi
  echo "$out" | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_request() { # args -> instructions per request
  local a b
  a=$(count "$N" "$@")
  b=$(count $((2 * N)) "$@")
  echo $(( (b - a) / N ))
}
bare=$(per_request bare)
tollgate=$(per_request tollgate)
governor=$(per_request governor)
prometheus=$(per_request tollgate prometheus)
echo "| service | instructions per request | added by the layer |"
echo "|---|---:|---:|"
echo "| bare | $bare | |"
echo "| tollgate (memory, IETF headers) | $tollgate | $((tollgate - bare)) |"
echo "| tower_governor (headers on) | $governor | $((governor - bare)) |"
echo "| tollgate, Prometheus recorder installed | $prometheus | $((prometheus - bare)) |"
if [[ "${FEATURES:-}" == *rules* ]]; then
  rules=$(per_request rules)
  echo "| tollgate, the quota as a rules file | $rules | $((rules - bare)) |"
fi
python3 -c "print(f'tollgate adds {($tollgate - $bare) / ($governor - $bare):.2f}x what tower_governor adds')"
