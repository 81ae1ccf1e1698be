#!/usr/bin/env bash
# Time through the layer, as whole runs in interleaved rounds: the binary of
# benches/layer_instructions.rs (requests polled through the layer with no
# runtime, one hot key, every request admitted) sends N requests bare, then
# behind tollgate, then behind tower_governor, round after round. Each run's
# CPU time (user and system, which leaves out the time a VM's CPU is
# stolen) is read from the kernel; a round's ratio is what tollgate adds to
# bare over what tower_governor adds, and the median of the rounds' ratios
# is printed with their range. Criterion's runs of one case after another
# cannot settle this on a shared VM: its speed drifts between cases by more
# than a layer costs (layer/bare read 374-504 ns in three runs in a row).
#
#   scripts/bench-layer-time.sh                       # N=1000000 ROUNDS=15
#   BIN=DIR/layer_instructions scripts/bench-layer-time.sh   # another build
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000000}
ROUNDS=${ROUNDS:-15}
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo build --release --quiet --bench layer_instructions
  bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/layer_instructions-* | grep -v '\.d$' | head -n 1)
fi
python3 - "$bin" "$N" "$ROUNDS" <<'EOF'
import resource, statistics, subprocess, sys

binary, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
modes = ["bare", "tollgate", "governor"]

def cpu_ns(mode):
    """CPU time of one run of n requests, in nanoseconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([binary, str(n), mode], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return spent * 1e9

rows = []
for r in range(rounds):
    # The order turns each round, so that no case always follows another.
    order = modes[r % 3:] + modes[:r % 3]
    row = {mode: cpu_ns(mode) / n for mode in order}
    rows.append(row)
    print(f"round {r + 1}: " + ", ".join(f"{m} {row[m]:.0f} ns" for m in modes), flush=True)

ratios = [(row["tollgate"] - row["bare"]) / (row["governor"] - row["bare"]) for row in rows]
added = lambda m: statistics.median(row[m] - row["bare"] for row in rows)
print(f"bare {statistics.median(row['bare'] for row in rows):.0f} ns a request (median)")
print(f"tollgate adds {added('tollgate'):.0f} ns, tower_governor {added('governor'):.0f} ns (medians)")
print(f"tollgate / tower_governor, added time: median {statistics.median(ratios):.2f}x, "
      f"rounds {min(ratios):.2f}-{max(ratios):.2f}x")
EOF
