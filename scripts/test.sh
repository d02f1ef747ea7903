#!/usr/bin/env bash
# Installs what the tests need (PostgreSQL, Redis, Chromium and Prometheus from Debian, a virtual environment with
# the project and its test extras) and runs the whole suite. The tests start their own throwaway servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v chromium >/dev/null || need+=(chromium)  # opens the HTML report in a test
command -v prometheus >/dev/null || need+=(prometheus)  # scrapes two workers in the scale-down drill
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
# alone. The first part runs on REELBATCH_TEST_WORKERS pytest-xdist workers (default 2; 0 is one process), a test
# module to a worker, the slowest first, the toy trainings all on one worker (tests/xdist_units.py), and the math
# libraries on one thread (OMP_NUM_THREADS=1; a test that needs more sets its own). Measured on this project's
# 2-core machine while other jobs loaded it (load 12): `toy train --quick` on one thread trained in 115 CPU-s
# (386 s); on two threads it spent 357 s, 76 CPU-s of them, on its first 3 of 24 VAE steps (14 s on one thread),
# its threads waiting on each other at every operation. Three workers with their default threads took 34 min of
# tests (the quick toy past its 900 s limit); one process, 1714 s for CI's last full run, installs included.
# Exit status 5 is pytest's "no tests collected" (arguments that select no quiet test, or only quiet ones).
workers="${REELBATCH_TEST_WORKERS:-2}"
threads=()
case "$workers" in 0|1) ;; *) threads=(env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}") ;; esac
status=0
"${threads[@]}" .venv/bin/python -m pytest -p tests.xdist_units -n "$workers" --dist loadscope --no-loadscope-reorder -m "not quiet" "$@" || status=$?
[ "$status" -eq 5 ] && status=0
quiet=0
.venv/bin/python -m pytest -m quiet "$@" || quiet=$?
[ "$quiet" -eq 5 ] && quiet=0
[ "$status" -ne 0 ] && exit "$status"
exit "$quiet"
