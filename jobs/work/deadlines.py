"""Deadlines as the fleet sees them: each unfinished run's projected finish (jobs.cost.projection) on the workers
alive now, for `reelbatch status` and for the deadline gauges every worker's sweeper publishes.

A worker is alive when its session is open and its heartbeat is younger than LOST_AFTER_LEASES leases: the age at
which a sweeper closes it as lost (jobs.work.sweeper).
"""

from __future__ import annotations

import logging
import math
from datetime import datetime

from sqlalchemy import select

from jobs.cost import profiles
from jobs.cost.estimate import Estimator
from jobs.cost.projection import Projection, alive_workers, projections
from jobs.db.base import utcnow
from jobs.db.queries import Factory
from jobs.db.rows import Run
from jobs.errors import UsageError
from jobs.observe.prometheus import DEADLINE_AT_RISK, DEADLINE_SLACK
from jobs.settings import Settings

log = logging.getLogger(__name__)

LOST_AFTER_LEASES = 3


def project(factory: Factory, settings: Settings, now: datetime, runs: list[Run] | None = None,
            bench_profiles: dict | None = None) -> dict[int, Projection]:
    """Projected finishes of the runs with work left (of `runs`, if given), by run id."""
    with factory() as s:
        workers = alive_workers(s, now, LOST_AFTER_LEASES * settings.limits.lease_s)
        known = profiles.load(settings.engine.cache_dir) if bench_profiles is None else bench_profiles
        return projections(s, Estimator(s, known), now, workers, runs)


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
