"""The fleet's housekeeping is done by one sweeper: that of the oldest worker session heard from lately
(jobs.work.sweeper, jobs.cost.ledger.sweeping_session); when that worker goes quiet, the next oldest takes it over."""

import threading
from datetime import timedelta

from sqlalchemy import select, update

from jobs.claims import claims
from jobs.cost.meter import Meter
from jobs.db import submission
from jobs.db.base import utcnow
from jobs.db.rows import WorkerSession, WorkUnit
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.settings import Settings
from jobs.work.sweeper import Sweeper
from tests.jobs.clocked import RATE


def expire_a_lease(factory) -> int:
    """A worker that died holding one unit: claimed, its lease already past. Returns the unit's id."""
    claim = claims.claim_batch(factory, owner="dead-worker", max_batch=1, lease_s=60)
    (unit,) = claim.units
    with factory.begin() as s:
        s.execute(update(WorkUnit).where(WorkUnit.id == unit.unit_id)
                  .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    return unit.unit_id


def status_of(factory, unit_id: int) -> Status:
    with factory() as s:
        return Status(s.scalar(select(WorkUnit.status).where(WorkUnit.id == unit_id)))


def test_only_the_oldest_live_session_sweeps_for_the_fleet_and_the_next_takes_over(db_url, factory, registry,
                                                                                    tmp_path):
    manifest = tmp_path / "r.yaml"
    manifest.write_text("name: r\nvideos:\n" + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(3)))
    submission.submit_run(factory, load_manifest(manifest, registry=registry), output=f"file://{tmp_path}/out/")
    # Lease 120 s, so a sweep every 15 s. The same unit is claimed and reaped three times here: five attempts allowed.
    settings = Settings.from_env({}).with_values({"database_url": db_url, "limits.max_attempts": 5})
    tickets = []
    meters = [Meter(RATE, factory, owner) for owner in ("older", "younger")]
    busy = threading.Event()
    busy.set()  # both rendering: no idle tickets, only the reaper's
    older, younger = (Sweeper(settings, factory, busy, lambda n, model: tickets.append((n, model)), meter, ("tiny",))
                      for meter in meters)
    for meter in meters:
        meter.open()
    assert meters[0].session_id < meters[1].session_id

    first = expire_a_lease(factory)
    younger.sweep()
    assert status_of(factory, first) is Status.RUNNING, "the younger worker leaves the fleet's housekeeping alone"
    older.sweep()
    assert status_of(factory, first) is Status.PENDING, "the oldest session reaps"
    assert tickets == [(1, "tiny")], "with a ticket for the reaped unit, on its model's queue"

    # The older worker goes quiet: its last heartbeat 31 s ago, past two of its 15 s intervals.
    with factory.begin() as s:
        s.execute(update(WorkerSession).where(WorkerSession.id == meters[0].session_id)
                  .values(last_seen_at=utcnow() - timedelta(seconds=31)))
    second = expire_a_lease(factory)
    younger.sweep()
    assert status_of(factory, second) is Status.PENDING, "the next oldest took the housekeeping over"

    # A sweeper without a session (none opened yet) sweeps for the fleet, as every one once did.
    third = expire_a_lease(factory)
    Sweeper(settings, factory, threading.Event(), lambda n, model: None, None, ("tiny",)).sweep()
    assert status_of(factory, third) is Status.PENDING
