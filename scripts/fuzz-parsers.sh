#!/usr/bin/env bash
# Runs the parser property tests (every test named `parse_*`: paths with
# their parameters, raw and encoded non-ASCII and backslashes; hosts with
# their case, trailing dot and port; rules files; Envoy rate limit
# configuration files; forwarding headers) on far
# more random input than CI does, for a while (10 minutes by default), in
# rounds with fresh seeds. Not part of CI.
#
#   scripts/fuzz-parsers.sh [SECONDS] [CASES_PER_ROUND]
#
# A failure stops at once; proptest prints the smallest input it found and
# saves its seed in a regressions file (beside the test's file, or in
# `tests/proptest-regressions/` for a test binary's module), which the next
# `cargo test` tries first: commit it with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-600}
cases=${2:-20000}
cargo test --release --all-features --tests --no-run

log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
rounds=0
while [ $(( $(date +%s) - start )) -lt "$seconds" ]; do
  rounds=$((rounds + 1))
  if ! PROPTEST_CASES=$cases cargo test --release --all-features --tests parse_ >"$log" 2>&1; then
    grep -vE '^test .* ok$' "$log" >&2
    echo "fuzz-parsers: a parser failed in round $rounds" >&2
    exit 1
  fi
  tests=$(grep -cE '^test .*parse_.* ok$' "$log" || true)
  echo "round $rounds: $tests tests x $cases cases passed ($(( $(date +%s) - start )) s)"
done
echo "fuzz-parsers: $rounds round(s) of $cases cases per test in $(( $(date +%s) - start )) s, no failure"
