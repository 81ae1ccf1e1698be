#!/usr/bin/env bash
# Two builds of `benches/cores.rs` alternated run by run on one machine,
# then each build's ratios as medians of its runs. On many cores a run's
# ratio to GCRA moves by up to 0.3 from the median of several, so a change
# reads against its base only in one such series.
#
#   scripts/bench-cores.sh build A         # at the base
#   scripts/bench-cores.sh build B         # at the change
#   scripts/bench-cores-ab.sh A B          # alternated; needs bash alone
#   scripts/bench-cores-ab.sh report OUT   # medians (python3)
#
# RUNS (8) runs of each build, stopping early past LIMIT_S seconds (600);
# each report is OUT/<build's folder name>-<run>.md, OUT being
# target/bench-cores-ab unless set. THREADS, CELL_MS, ROUNDS, SHAPES and
# ONLY pass to the runs (see bench-cores.sh); the report follows at the end
# where python3 is found.
set -euo pipefail

report() {
  python3 - "$1" <<'EOF'
import re, statistics, sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
rows = defaultdict(lambda: defaultdict(list))  # build -> row -> runs' cells
heads = {}
for f in sorted(out.glob("*-*.md")):
    build, section = f.stem.rsplit("-", 1)[0], ""
    for line in f.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].split(":")[0]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "ratio":
            heads[build] = cells[1:]
        elif " / " in cells[0] and all(re.fullmatch(r"[\d.]+x", c) for c in cells[1:]):
            row = f"{section}: {cells[0]}"
            rows[build][row].append([float(c[:-1]) for c in cells[1:]])
for build, by_row in rows.items():
    runs = max(len(r) for r in by_row.values())
    print(f"\n{build}: medians of {runs} runs (lowest-highest)\n")
    print("| ratio | " + " | ".join(heads.get(build, [])) + " |")
    print("|---|" + "---:|" * len(heads.get(build, [])))
    for name, runs_cells in by_row.items():
        cols = zip(*runs_cells)
        shown = [f"{statistics.median(c):.2f}x ({min(c):.2f}-{max(c):.2f})" for c in cols]
        print(f"| {name} | " + " | ".join(shown) + " |")
EOF
}

if [ "${1:-}" = report ]; then
  report "${2:?report needs the folder of the runs}"
  exit 0
fi

a=${1:?usage: bench-cores-ab.sh A B}
b=${2:?usage: bench-cores-ab.sh A B}
out=${OUT:-target/bench-cores-ab}
mkdir -p "$out"
start=$(date +%s)
for run in $(seq 1 "${RUNS:-8}"); do
  for dir in "$a" "$b"; do
    elapsed=$(( $(date +%s) - start ))
    if [ "$elapsed" -gt "${LIMIT_S:-600}" ]; then
      break 2
    fi
    echo "$(basename "$dir") run $run at ${elapsed} s" >&2
    "$dir/cores" > "$out/$(basename "$dir")-$run.md" 2>/dev/null
  done
done
if command -v python3 >/dev/null; then
  report "$out"
fi
