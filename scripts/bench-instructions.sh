#!/usr/bin/env bash
# Instructions per in-memory check, tollgate beside governor, counted by
# callgrind: each case runs at two lengths and the difference is divided by
# the difference in checks, so setup and teardown cancel. Counts do not
# depend on machine noise.
#
#   scripts/bench-instructions.sh            # every case
#   scripts/bench-instructions.sh tollgate/gcra governor/gcra
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }

cargo build --release --bench instructions --quiet 2>/dev/null || cargo bench --bench instructions --no-run --quiet
bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/instructions-* | grep -v '\.d$' | head -n 1)

cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  cases=(governor/gcra tollgate/gcra tollgate/token_bucket tollgate/token_bucket_fractional tollgate/token_bucket_fractional_pair tollgate/leaky_bucket
         tollgate/fixed_window tollgate/fixed_window_two_a_microsecond tollgate/sliding_window tollgate/sliding_window_rolling tollgate/sliding_window_refusing tollgate/sliding_log tollgate/three_quotas
         tollgate/three_quotas_admitted tollgate/three_quotas_flood tollgate/three_quotas_refused
         tollgate/reserve_settle_keep tollgate/reserve_settle_below tollgate/reserve_settle_above)
fi
short=${SHORT:-1000000}
long=${LONG:-5000000}

count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

printf '| case | instructions per check |\n|---|---:|\n'
for case in "${cases[@]}"; do
  a=$(count "$case" "$short")
  b=$(count "$case" "$long")
  printf '| %s | %s |\n' "$case" "$(( (b - a) / (long - short) ))"
done
