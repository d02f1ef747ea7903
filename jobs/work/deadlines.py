"""Deadlines as the fleet sees them: each unfinished run's projected finish (jobs.cost.projection) on the workers
alive now, for `reelbatch status` and for the deadline gauges every worker's sweeper publishes.

A worker is alive when its session is open and its heartbeat is younger than LOST_AFTER_LEASES leases: the age at
which a sweeper closes it as lost (jobs.work.sweeper).
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import datetime

from sqlalchemy import select

from jobs.cost import profiles
from jobs.cost.estimate import Estimator
from jobs.cost.projection import Projection, alive_workers, projections, queued
from jobs.db.base import utcnow
from jobs.db.queries import Factory
from jobs.db.rows import Run
from jobs.errors import UsageError
from jobs.observe.prometheus import DEADLINE_AT_RISK, DEADLINE_SLACK
from jobs.settings import Settings

log = logging.getLogger(__name__)

LOST_AFTER_LEASES = 3


def project(factory: Factory, settings: Settings, now: datetime, runs: list[Run] | None = None,
            bench_profiles: dict | None = None, queue: QueueSnapshot | None = None) -> dict[int, Projection]:
    """Projected finishes of the runs with work left (of `runs`, if given), by run id; the work ahead of them from
    `queue`'s latest read when one is given."""
    with factory() as s:
        workers = alive_workers(s, now, LOST_AFTER_LEASES * settings.limits.lease_s)
        known = profiles.load(settings.engine.cache_dir) if bench_profiles is None else bench_profiles
        return projections(s, Estimator(s, known), now, workers, runs, None if queue is None else queue.rows())


class QueueSnapshot:
    """The whole queue as jobs.cost.projection.queued groups it, read again every `every_s` seconds by a thread of
    its own. A long-lived process (`serve`) projects a team's runs against it, so a team's status costs what its own
    runs do, never what another team's 100,000 pending videos do (a read of them took 0.16 s on SQLite): the work
    ahead may be `every_s` old, the run's own is read at each request. Until the first read, rows() reads it now."""

    def __init__(self, factory: Factory, every_s: float = 5.0):
        self.factory, self.every_s = factory, every_s
        self._rows: list | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="queue-snapshot", daemon=True)
        self._thread.start()

    def rows(self) -> list:
        found = self._rows
        if found is None:
            with self.factory() as s:
                found = queued(s)
        return found

    def _loop(self) -> None:
        while True:
            try:
                with self.factory() as s:
                    self._rows = queued(s)
            except Exception as exc:  # noqa: BLE001 - a database away for a moment: the last read stands
                log.warning("reading the queue for projections failed: %s", exc)
            if self._stop.wait(self.every_s):
                return

    def stop(self) -> None:
        self._stop.set()


class Gauges:
    """reelbatch_deadline_slack_seconds and reelbatch_deadline_at_risk for each unfinished run with a deadline; a
    run's series go when it finishes or expires."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.shown: set[str] = set()

    def publish(self, factory: Factory) -> None:
        now = utcnow()
        with factory() as s:
            runs = list(s.scalars(select(Run).where(Run.deadline.is_not(None), Run.expired_at.is_(None))))
        found: dict[int, Projection] = {}
        if runs:
            try:
                bench = profiles.load(self.settings.engine.cache_dir)
            except UsageError as exc:  # a worker keeps working: the projection goes without profiles
                log.warning("%s", exc)
                bench = {}
            found = project(factory, self.settings, now, runs, bench)
        names = set()
        for p in found.values():
            names.add(p.name)
            slack, risk = p.slack_s, p.at_risk
            DEADLINE_SLACK.labels(p.name).set(math.nan if slack is None else slack)
            DEADLINE_AT_RISK.labels(p.name).set(math.nan if risk is None else float(risk))
        for name in self.shown - names:
            DEADLINE_SLACK.remove(name)
            DEADLINE_AT_RISK.remove(name)
        self.shown = names
