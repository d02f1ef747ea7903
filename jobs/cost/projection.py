"""When queued work will be done: the GPU seconds waiting ahead of a run, the workers alive to render them, and each
unfinished run's projected finish against its deadline (for `status`, the deadline gauges and `estimate`).

The rule, stated once: a run finishes when the work ahead of it and its own are done on the workers alive now,
each busy UTILISATION of the time: finish = now + (ahead + own GPU seconds) / (workers x UTILISATION). UTILISATION is
capacity planning's sustainable level (jobs.reports.capacity caps at it: model loads, claims and the gaps between
tickets keep a fleet from being busy every second). Work ahead of a run is every running unit and every pending unit
that ranks at or above it (jobs.db.submission.unit_rank). Seconds come from jobs.cost.estimate, a unit being a video's
share (one chunk of a long video); units of a shape with no basis are counted, not guessed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.cost.estimate import Estimator, VideoShape
from jobs.db.base import as_utc
from jobs.db.rows import Run, Video, WorkerSession, WorkUnit
from jobs.db.status import Status

# Defined here, below the reports, so that capacity planning (jobs.reports.capacity) and this rule share one figure.
UTILISATION = 0.75


@dataclass(frozen=True)
class Queued:
    """Units of one run and shape still to render."""

    run_id: int
    rank: int
    running: bool
    shape: VideoShape
    units: int


def queued(s: Session, run_ids: Collection[int] | None = None) -> list[Queued]:
    """Every pending or running unit (of the runs `run_ids` only, if given), grouped by run, rank, state and shape."""
    columns = (Video.run_id, WorkUnit.rank, WorkUnit.status, Run.model, Video.width, Video.height, Video.frames,
               Video.steps, Video.guidance, Video.chunks, WorkUnit.frames)
    query = select(*columns, func.count()).join(Video, Video.id == WorkUnit.video_id).join(Run, Run.id == Video.run_id)
    if run_ids is None:
        query = query.where(WorkUnit.status.in_([Status.PENDING, Status.RUNNING])).group_by(*columns)
    else:
        # Through the runs' videos and each one's units (both indexed). Without statistics SQLite chose to read
        # every pending unit of every run by their status index instead (15 ms with another run's 100,000 pending),
        # even with the state tested after grouping: the state is tested as lower(status), which no index serves.
        unfinished = func.lower(WorkUnit.status).in_([Status.PENDING.value, Status.RUNNING.value])
        query = query.where(unfinished, WorkUnit.video_id.in_(select(Video.id).where(Video.run_id.in_(list(run_ids)))))
        query = query.group_by(*columns)
    rows = s.execute(query).all()
    return [Queued(run_id, rank, Status(status) is Status.RUNNING, VideoShape(model, w, h, f, st, g, c, window), n)
            for run_id, rank, status, model, w, h, f, st, g, c, window, n in rows]


@dataclass(frozen=True)
class Work:
    seconds: float  # known GPU seconds
    unknown_units: int  # units of shapes with no basis, not in `seconds`


def total(est: Estimator, items: list[Queued]) -> Work:
    seconds, unknown = 0.0, 0
    for q in items:
        basis = est.seconds(q.shape)
        if basis.seconds is None:
            unknown += q.units
        else:
            seconds += basis.seconds / q.shape.chunks * q.units
    return Work(seconds, unknown)


def ahead(est: Estimator, rows: list[Queued], rank: int, run_id: int | None = None) -> Work:
    """The work ahead of a run ranked `rank`: running units, and pending units ranked at or above it (not its own)."""
    return total(est, [q for q in rows if q.run_id != run_id and (q.running or q.rank >= rank)])


def alive_workers(s: Session, now: datetime, stale_s: float) -> int:
    """Worker sessions open and heard from within `stale_s` (the sweeper's threshold for a lost worker)."""
    return s.scalar(select(func.count()).select_from(WorkerSession).where(
        WorkerSession.ended_at.is_(None), WorkerSession.last_seen_at >= now - timedelta(seconds=stale_s)))


def finish_s(seconds: float, workers: int) -> float | None:
    return seconds / (workers * UTILISATION) if workers > 0 else None


@dataclass(frozen=True)
class Projection:
    run_id: int
    name: str
    own: Work
    ahead: Work
    workers: int
    finishes_at: datetime | None  # None: no worker alive, or some of its own work has no basis
    deadline: datetime | None
    expired: bool

    @property
    def slack_s(self) -> float | None:
        """Seconds between the projected finish and the deadline (negative: late)."""
        if self.deadline is None or self.finishes_at is None:
            return None
        return (self.deadline - self.finishes_at).total_seconds()

    @property
    def at_risk(self) -> bool | None:
        """Projected to finish after its deadline, or with no worker alive to render it. None: no deadline, or
        too little known to say."""
        if self.deadline is None or self.expired:
            return None
        if self.workers == 0:
            return True
        slack = self.slack_s
        if slack is None:
            return None
        # Unknown work only adds time: a finish already late is late; one on time is not known to be.
        return True if slack < 0 else (False if not self.ahead.unknown_units else None)

    def to_dict(self) -> dict:
        return {"remaining_gpu_s": None if self.own.unknown_units else self.own.seconds,
                "queue_ahead_s": self.ahead.seconds, "unknown_units": self.own.unknown_units + self.ahead.unknown_units,
                "workers": self.workers,
                "projected_finish": self.finishes_at.isoformat() if self.finishes_at else None,
                "deadline": self.deadline.isoformat() if self.deadline else None, "slack_s": self.slack_s,
                "at_risk": self.at_risk, "expired": self.expired}


def projections(s: Session, est: Estimator, now: datetime, workers: int,
                runs: list[Run] | None = None, others: list[Queued] | None = None) -> dict[int, Projection]:
    """Each run with work pending or running (of `runs`, if given): its projected finish. `others`: the queue as a
    recent read of it found it (jobs.work.deadlines.QueueSnapshot), for the work ahead of `runs`; their own units
    are read now, so a run's own figures are never stale and its status costs what its own size does."""
    if others is not None and runs is not None:
        ids = {r.id for r in runs}
        rows = [q for q in others if q.run_id not in ids] + queued(s, ids)
    else:
        rows = queued(s)
    if runs is None:
        ids = {q.run_id for q in rows}
        runs = list(s.scalars(select(Run).where(Run.id.in_(ids)))) if ids else []
    out = {}
    for run in runs:
        mine = [q for q in rows if q.run_id == run.id]
        if not mine:
            continue
        own = total(est, mine)
        rank = max((q.rank for q in mine), default=0)
        before = ahead(est, rows, rank, run.id)
        seconds = finish_s(own.seconds + before.seconds, workers)
        finish = None if seconds is None or own.unknown_units else now + timedelta(seconds=seconds)
        out[run.id] = Projection(run.id, run.name, own, before, workers, finish,
                                 as_utc(run.deadline) if run.deadline else None, run.expired_at is not None)
    return out
