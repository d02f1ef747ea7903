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
# Two parts. First everything but the `quiet` tests, then the `quiet` tests, which time renders on the real clock,
# alone. REELBATCH_TEST_WORKERS=N runs the first part on N pytest-xdist workers, a test module to a worker, the
# slowest first (tests/xdist_units.py). The default is one process: on 2 cores, 3 workers took 34 min against about
# 33 serially for fewer tests, and the CPU-bound trainings then ran side by side past their time limits.
# Exit status 5 is pytest's "no tests collected" (arguments that select no quiet test, or only quiet ones).
workers="${REELBATCH_TEST_WORKERS:-0}"
status=0
.venv/bin/python -m pytest -p tests.xdist_units -n "$workers" --dist loadscope --no-loadscope-reorder -m "not quiet" "$@" || status=$?
[ "$status" -eq 5 ] && status=0
quiet=0
.venv/bin/python -m pytest -m quiet "$@" || quiet=$?
[ "$quiet" -eq 5 ] && quiet=0
[ "$status" -ne 0 ] && exit "$status"
exit "$quiet"
