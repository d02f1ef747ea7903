#!/usr/bin/env bash
# Installs what the tests need (PostgreSQL and Redis servers from Debian, a virtual environment with the project and
# its test extras) and runs the whole suite. The tests start their own throwaway servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v chromium >/dev/null || need+=(chromium)  # opens the HTML report in a test
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

python3 -m venv .venv
# torch first and pinned: the CPU build; an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'

# Fail, never skip, when a server the tests need is missing.
export REELBATCH_REQUIRE_SERVICES=1
exec .venv/bin/python -m pytest "$@"
