"""Teams sharing the fleet, in the claim (jobs.claims.claims.claim_batch): which teams may start work now, and in what
order a claim tries them.

- max_gpus: a team whose work runs on `max_gpus` workers (distinct lease owners of its running units, one batch per
  GPU) starts nothing more until one finishes.
- monthly_usd: a team whose runs have been charged `monthly_usd` or more in this calendar month (UTC; every cost
  record of its videos, as a run's budget counts them) starts nothing more this month. The sum is read at most every
  CHARGES_TTL_S per process: a batch or two may start past the cap, never a run's worth.
- share: idle capacity goes to the eligible team furthest below its share: the fewest running units per unit of
  share across the fleet (what every worker sees), then, on a tie, the fewest units this process has claimed for
  it per unit of share (stride scheduling on the worker's own claims, so even one worker alternates). A team with
  10,000 videos waiting cannot starve one with 10: the small team's first unit is the next claim. Inside a team the
  claim's own order holds (rank: priority, age, deadline).

When only one team has work waiting and no quota binds it, the claim is the plain one (no team clause): a fleet of
one team pays for this only the per-team probes below, one index entry each (ix_work_units_claim_team).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from jobs.db.queries import waiting_units
from jobs.db.rows import WorkUnit
from jobs.db.service_rows import Team
from jobs.db.status import Status
from jobs.db.teams import DEFAULT, month_charges, month_start

CHARGES_TTL_S = 10.0


@dataclass(frozen=True)
class Turn:
    team_id: int
    clause: object  # the where-clause for the team's units

    @staticmethod
    def of(team_id: int, default: bool) -> Turn:
        column = WorkUnit.team_id
        return Turn(team_id, or_(column == team_id, column.is_(None)) if default else column == team_id)


def running_by_team(s: Session, default_id: int) -> dict[int, tuple[int, int]]:
    """{team id: (running units, workers running them)}; units of no team count as the default team's."""
    team = func.coalesce(WorkUnit.team_id, default_id)
    rows = s.execute(select(team, func.count(), func.count(func.distinct(WorkUnit.lease_owner)))
                     .where(WorkUnit.status == Status.RUNNING).group_by(team)).all()
    return {t: (units, workers) for t, units, workers in rows}


@dataclass
class FairShare:
    """One per worker process (`shared()`): what it has claimed for each team, and its cache of month charges."""

    clock: object = time.monotonic
    served: dict[int, int] = field(default_factory=dict)
    _charges: dict[int, tuple[float, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def turns(self, s: Session, now: datetime) -> list[Turn | None]:
        """The teams to try, in order; [None]: no team clause (one team waits, unbound); []: nobody may start."""
        teams = list(s.execute(select(Team.id, Team.name, Team.share, Team.max_gpus, Team.monthly_micro_usd)))
        default_id = next((t.id for t in teams if t.name == DEFAULT), None)
        waiting = [t for t in teams if s.scalar(select(WorkUnit.id).where(
            *waiting_units(), Turn.of(t.id, t.name == DEFAULT).clause).limit(1)) is not None]
        if not waiting:
            return [None]  # no team's units wait (or only units of no team): the plain claim decides
        running = running_by_team(s, default_id if default_id is not None else -1)
        eligible = [t for t in waiting if self._may_start(s, t, running.get(t.id, (0, 0))[1], now)]
        if len(waiting) == 1 and len(eligible) == 1:
            return [None]
        with self._lock:
            eligible.sort(key=lambda t: (running.get(t.id, (0, 0))[0] / t.share, self.served.get(t.id, 0) / t.share,
                                         t.id))
        return [Turn.of(t.id, t.name == DEFAULT) for t in eligible]

    def _may_start(self, s: Session, team, workers: int, now: datetime) -> bool:
        if team.max_gpus is not None and workers >= team.max_gpus:
            return False
        if team.monthly_micro_usd is not None:
            return self._charged(s, team, now) < team.monthly_micro_usd
        return True

    def _charged(self, s: Session, team, now: datetime) -> int:
        with self._lock:
            cached = self._charges.get(team.id)
        if cached is not None and self.clock() - cached[0] < CHARGES_TTL_S:
            return cached[1]
        micro = month_charges(s, team.id, team.name == DEFAULT, month_start(now))
        with self._lock:
            self._charges[team.id] = (self.clock(), micro)
        return micro

    def claimed(self, units) -> None:
        """Count a claim's units (work unit rows) for their teams."""
        with self._lock:
            for unit in units:
                self.served[unit.team_id] = self.served.get(unit.team_id, 0) + 1


_SHARED: FairShare | None = None


def shared() -> FairShare:
    """This process's FairShare (a worker's claims all go through it)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = FairShare()
    return _SHARED
