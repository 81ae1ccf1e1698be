#!/usr/bin/env bash
# Checks per second on many cores (benches/cores.rs): one hot key and many
# keys at 1, 2, 4, 8 and 16 threads, every algorithm plain and batched
# (BatchBackend), governor beside GCRA; one markdown report with ratios.
#
#   scripts/bench-cores.sh                # build (release), then run here
#   scripts/bench-cores.sh build DIR      # build only: DIR holds the release
#                                         # binaries (cores, http_server,
#                                         # http_load) and the scripts
#   DIR/bench-cores.sh                    # there: runs, no cargo, no network
#   DIR/bench-http.sh                     # the HTTP part (see that script)
#
# 13 cases x 5 thread counts x 2 key shapes x ROUNDS (3) = 390 cells of CELL_MS (300 ms):
# about two minutes; THREADS=1,2 CELL_MS=100 for a quick look. Writes the report
# to OUT (target/bench-cores, or DIR/out/cores) as report.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# The path of a release target's executable, as cargo reports it.
built() {
  grep -o '"executable":"[^"]*"' | grep "$1" | tail -n1 | sed 's/.*:"//; s/"$//'
}

build() {
  mkdir -p "$1"
  local dir
  dir=$(cd "$1" && pwd)
  cd "$here/.."
  local json
  json=$(cargo build --release --bench cores --bench http_server --bench http_load --message-format=json)
  cp "$(echo "$json" | built /cores-)" "$dir/cores"
  cp "$(echo "$json" | built /http_server-)" "$dir/http_server"
  cp "$(echo "$json" | built /http_load-)" "$dir/http_load"
  cp scripts/bench-cores.sh scripts/bench-http.sh scripts/bench_report.py "$dir/"
  echo "built into $dir: $(ls "$dir" | tr '\n' ' ')"
}

if [ "${1:-}" = build ]; then
  build "${2:?build needs a directory}"
  exit 0
fi

if [ -x "$here/cores" ]; then
  bin=$here/cores
  out=${OUT:-$here/out/cores}
else
  cd "$here/.."
  bin=$(cargo build --release --bench cores --message-format=json | built /cores-)
  out=${OUT:-${CARGO_TARGET_DIR:-target}/bench-cores}
fi
mkdir -p "$out"
# Progress on stderr, the report on stdout.
"$bin" > "$out/report.md"
cat "$out/report.md"
