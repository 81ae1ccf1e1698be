#!/usr/bin/env bash
# Time, beside the peer, with the cases interleaved in one process:
#
#   engine  benches/instructions.rs: governor's GCRA and tollgate's hot-key
#           cases (GCRA, fixed window, the token bucket of 3 and of 999 999
#           units a second, the sliding window), 10 000 checks at a time,
#           each case's time over governor's and over tollgate's GCRA;
#   layer   benches/layer_instructions.rs: bare, tollgate and
#           tower_governor (IETF headers / headers on, one hot key, polled
#           with no runtime), 1 000 requests at a time, the time each layer
#           adds to bare and tollgate's over tower_governor's.
#
# Each run's lines are printed, then every ratio's median over the runs and
# its range. Only cases interleaved this finely compare on a shared VM:
# criterion's runs of one case after another, and whole runs of one process
# after another, drift by more than these differences (layer/bare read
# 374-504 ns in three criterion runs in a row).
#
#   scripts/bench-time.sh engine                  # N=2000000 RUNS=5
#   scripts/bench-time.sh layer                   # N=2000000 RUNS=7
#   BIN=DIR/instructions scripts/bench-time.sh engine   # another build
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
case "$what" in
  engine) bench=instructions runs=${RUNS:-5} ;;
  layer) bench=layer_instructions runs=${RUNS:-7} ;;
  *) echo "usage: $0 engine|layer" >&2; exit 2 ;;
esac
N=${N:-2000000}
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo build --release --quiet --bench "$bench"
  bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/"$bench"-* | grep -v '\.d$' | head -n 1)
fi
for _ in $(seq "$runs"); do
  if [ "$what" = engine ]; then "$bin" time "$N"; else "$bin" "$N" time; fi
done | tee /dev/stderr | python3 -c '
import re, statistics, sys
ratios = {}
for line in sys.stdin:
    case, _, rest = line.partition(":")
    for value, of in re.findall(r"([0-9.]+)x ([^,\s]+)", rest):
        ratios.setdefault((case.strip(), of), []).append(float(value))
for (case, of), values in ratios.items():
    if case != of:
        print(f"{case} / {of}: median {statistics.median(values):.2f}x "
              f"({min(values):.2f}-{max(values):.2f}x, {len(values)} runs)")
'
