#!/usr/bin/env bash
# Time through the layer: the binary of benches/layer_instructions.rs in its
# `time` mode, where bare, tollgate and tower_governor take turns in one
# process, 1 000 requests at a time (polled with no runtime, one hot key,
# every request admitted). Prints each run's line and the median, over the
# runs, of what tollgate adds to bare over what tower_governor adds.
#
# Only cases interleaved this finely compare on a shared VM: criterion's
# runs of one case after another, and whole runs of one process after
# another, drift by more than a layer costs (layer/bare read 374-504 ns in
# three criterion runs in a row).
#
#   scripts/bench-layer-time.sh                              # N=2000000 RUNS=7
#   BIN=DIR/layer_instructions scripts/bench-layer-time.sh   # another build
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000000}
RUNS=${RUNS:-7}
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo build --release --quiet --bench layer_instructions
  bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/layer_instructions-* | grep -v '\.d$' | head -n 1)
fi
for _ in $(seq "$RUNS"); do
  "$bin" "$N" time
done | tee /dev/stderr | python3 -c '
import re, statistics, sys
ratios = [float(re.search(r"ratio ([0-9.]+)", line).group(1)) for line in sys.stdin]
print(f"tollgate / tower_governor, time added: median {statistics.median(ratios):.2f}x "
      f"of {len(ratios)} runs ({min(ratios):.2f}-{max(ratios):.2f}x)")
'
