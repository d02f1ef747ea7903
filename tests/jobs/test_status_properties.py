"""Property tests: whatever sequence of claims, results, expiries, cancels and resumes happens, every video moves
only along legal transitions, a succeeded video never changes again, and it has exactly one cost record."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sqlalchemy import func, select, update

from engine.models.registry import Registry
from jobs.claims import claims, leases
from jobs.cost.prices import Rate
from jobs.db import queries, submission
from jobs.db.connect import session_factory
from jobs.db.rows import CostRecord, Run, Video, WorkUnit
from jobs.db.status import TRANSITIONS, IllegalTransition, Status, transition
from jobs.manifest import load_manifest
from jobs.render import record


@given(st.sampled_from(list(Status)), st.sampled_from(list(Status)))
def test_transition_allows_exactly_the_table(old, new):
    class Row:
        id, status = 1, old

    row = Row()
    if new in TRANSITIONS[old]:
        transition(row, new)
        assert row.status is new
    else:
        with pytest.raises(IllegalTransition):
            transition(row, new)
        assert row.status is old
    assert TRANSITIONS[Status.SUCCEEDED] == frozenset()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("props")
    return folder, session_factory(f"sqlite:///{folder / 'p.db'}")


_runs = itertools.count()
OUT = record.VideoOutput("file:///x.mp4", 10, "ab" * 32, 1.0, 0.0, 0.0)
RATE = Rate(3.6, "test")


class Lifecycle(RuleBasedStateMachine):
    folder = factory = None

    @initialize()
    def submit(self):
        # Earlier examples' leftovers must not be claimable, or each example would depend on the ones before it.
        with self.factory.begin() as s:
            s.execute(update(WorkUnit).values(status=Status.CANCELLED))
        self.run = f"p{next(_runs)}"
        path = self.folder / f"{self.run}.yaml"
        path.write_text(f"name: {self.run}\nvideos:\n" + "".join(f"  - {{id: v{i}, prompt: p}}\n" for i in range(3)))
        submission.submit_run(self.factory, load_manifest(path, registry=Registry()), output="file:///x/")
        self.held: list[claims.ClaimedUnit] = []
        self.seen = self.statuses()

    def statuses(self) -> dict[int, Status]:
        with self.factory() as s:
            return {v.id: Status(v.status) for v in s.scalars(select(Video).join(Run).where(Run.name == self.run))}

    @rule(size=st.integers(1, 3))
    def claim(self, size):
        claim = claims.claim_batch(self.factory, owner="w", max_batch=size, lease_s=600)
        if claim is not None:
            self.held += [u for u in claim.units if u.run_name == self.run]

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 20), outcome=st.sampled_from(["success", "failure", "retry", "release", "upload"]))
    def act(self, i, outcome):
        unit = self.held[i % len(self.held)]  # may be stale: its writes must then change nothing
        if outcome == "success":
            record.record_success(self.factory, unit, OUT, RATE)
        elif outcome == "failure":
            record.record_failure(self.factory, unit, "bad")
        elif outcome == "retry":
            record.record_retry(self.factory, unit, "flaky", max_attempts=2, backoff_s=0)
        elif outcome == "release":
            leases.release(self.factory, unit)
        else:
            record.mark_all_uploading(self.factory, [(unit, "cd" * 32)])

    @rule()
    def expire_and_reap(self):
        with self.factory.begin() as s:
            s.execute(update(WorkUnit).where(WorkUnit.status == Status.RUNNING)
                      .values(lease_expires_at=WorkUnit.created_at))
        leases.reap_expired(self.factory, max_attempts=2)

    @rule()
    def cancel(self):
        queries.cancel_run(self.factory, self.run)

    @rule()
    def resume(self):
        queries.resume_run(self.factory, self.run)

    @invariant()
    def only_legal_moves_success_is_final_and_costs_once(self):
        now = self.statuses()
        for vid, new in now.items():
            old = self.seen[vid]
            assert new is old or new in TRANSITIONS[old], f"video {vid}: {old.value} -> {new.value}"
        self.seen = now

        with self.factory() as s:
            costs = dict(s.execute(select(CostRecord.video_id, func.count()).where(CostRecord.kind == "gpu")
                                   .group_by(CostRecord.video_id)).all())
        for vid, status in now.items():
            assert costs.get(vid, 0) == (1 if status is Status.SUCCEEDED else 0), "one cost record per success"


def test_lifecycle_properties(shared):
    Lifecycle.folder, Lifecycle.factory = shared
    Lifecycle.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
    Lifecycle.TestCase().runTest()
