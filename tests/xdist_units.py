"""How scripts/test.sh splits the suite between pytest-xdist workers (`-p tests.xdist_units -n 2 --dist loadscope`).

Most of the slowest tests are real-clock drills (worker processes killed, frozen and thawed, leases left to expire,
servers taken off the network) that spend part of their time waiting, and many of the small tests start a CLI
process, work for one core: a second worker fills the other core. A unit of work is a test module, so a
module's fixtures (a server, a render its tests share) are built once, except that modules sharing a costly session
fixture are one unit, built by one worker only (each worker is its own pytest session). The toy trainings are one
unit too, so they never run side by side: on three workers (a loaded machine) the quick toy's training ran past
its 900 s limit.
Loaded as a plugin only there: without xdist its hook is unknown to pytest.
"""

from __future__ import annotations

# Modules that share a costly session fixture, or that must not run beside each other: one unit.
SHARED_UNITS = {
    # The CPU-bound toy trainings, one after the other on one worker: `reelbatch toy train --quick`
    # (tests/conftest.py's quick_toy, shared by two modules), `toy distill --quick` and `toy first-frame --quick`
    # (module fixtures), each a minute or more of training on a quiet machine.
    "tests/jobs/test_quality.py": "training",
    "tests/engine/test_toy_train.py": "training",
    "tests/engine/test_toy_distill.py": "training",
    "tests/jobs/test_quality_images.py": "training",
}
# Units handed out first, the likely longest first: the trainings, then the drills, which start real worker processes
# and wait out real leases, outages and grace periods (LEASE_S and the waits in each file). Starting them early keeps
# the last worker from finishing long after the other. The order is read from the code and from `--durations` on a
# loaded machine (shared by other jobs when it was written); reorder it from the `--durations` that scripts/test.sh
# prints.
SLOW_FIRST = (
    "training",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_stop.py",
    "tests/e2e/test_preempt.py",
    "tests/jobs/test_bench_quality.py",
    "tests/jobs/test_bench.py",
    "tests/e2e/test_run.py",
    "tests/jobs/test_toy_fast.py",
    "tests/e2e/test_fleet.py",
    "tests/jobs/test_leases.py",
    "tests/e2e/test_service.py",
    "tests/jobs/test_bench_fleet.py",
    "tests/e2e/test_beat.py",
    "tests/e2e/test_notify.py",
    "tests/e2e/test_images.py",
)
_RANK = {unit: i for i, unit in enumerate(SLOW_FIRST)}


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the name of the modules it shares a fixture with."""
    module = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(module, module)


def rank(nodeid: str) -> int:
    """Where its unit comes in the order the units are handed out (the rest after SLOW_FIRST, as collected)."""
    return _RANK.get(unit(nodeid), len(_RANK))


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadscope scheduling (whole units to a worker, in the order collected, with --no-loadscope-reorder)
    with `unit` as the scope."""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return Units(config, log)
