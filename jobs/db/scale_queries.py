"""What a scaler reads: the work still to render (pending and claimed units, with their shape, lease and deadline), the
worker sessions alive now and the leases each holds; and the scaling rule (jobs.cost.scale) as one SQL statement,
for KEDA's PostgreSQL scaler, which runs a query that returns one number.

The statement repeats the rule jobs.cost.scale computes from the first three queries (tests/jobs/test_scale.py holds
the two to the same count on real rows, SQLite and PostgreSQL): a unit's GPU seconds are the measured basis of
`estimate` (jobs.cost.estimate: the charged seconds per video over the RECENT newest successful videos of exactly its
shape) over its video's chunks, and a shape with no measured video counts no seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.db.base import as_utc
from jobs.db.rows import Run, Video, WorkerSession, WorkUnit
from jobs.db.status import Status

RECENT = 200  # jobs.cost.estimate.RECENT (this floor is below it): the videos a measured basis averages over
# A millionth of a worker is forgiven before rounding up, so float noise in a sum never asks for one more.
SLACK = 1e-6
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class OpenUnits:
    """Pending or running units of one model, shape, state, lease and deadline."""

    model: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    chunks: int
    window: int  # the unit's frames (a long video's window)
    running: bool
    lease_owner: str | None
    lease_expires_at: datetime | None
    deadline: datetime | None
    units: int


def open_units(s: Session, model: str | None = None) -> list[OpenUnits]:
    columns = (Run.model, Video.width, Video.height, Video.frames, Video.steps, Video.guidance, Video.chunks,
               WorkUnit.frames, WorkUnit.status, WorkUnit.lease_owner, WorkUnit.lease_expires_at, Run.deadline)
    where = [WorkUnit.status.in_([Status.PENDING, Status.RUNNING])] + ([Run.model == model] if model else [])
    rows = s.execute(select(*columns, func.count()).join(Video, Video.id == WorkUnit.video_id)
                     .join(Run, Run.id == Video.run_id).where(*where).group_by(*columns)).all()
    return [OpenUnits(m, w, h, f, st, g, c, win, Status(status) is Status.RUNNING, owner,
                      None if until is None else as_utc(until), None if due is None else as_utc(due), n)
            for m, w, h, f, st, g, c, win, status, owner, until, due, n in rows]


@dataclass(frozen=True)
class LiveSession:
    """A worker session open and heard from recently: who it is, what it serves, what it rendered at its last
    heartbeat (jobs.cost.meter writes `in_flight_videos` while it renders)."""

    id: int
    owner: str
    models: str | None
    in_flight: bool
    last_seen_at: datetime


def live_sessions(s: Session, now: datetime, stale_s: float) -> list[LiveSession]:
    rows = s.execute(select(WorkerSession.id, WorkerSession.owner, WorkerSession.models,
                            WorkerSession.in_flight_videos, WorkerSession.last_seen_at)
                     .where(WorkerSession.ended_at.is_(None),
                            WorkerSession.last_seen_at >= now - timedelta(seconds=stale_s))
                     .order_by(WorkerSession.id)).all()
    return [LiveSession(i, owner, models, bool(flight), as_utc(seen)) for i, owner, models, flight, seen in rows]


def lease_holders(s: Session, now: datetime) -> dict[str, int]:
    """Each owner holding an unexpired lease, with how many units it holds."""
    rows = s.execute(select(WorkUnit.lease_owner, func.count()).where(
        WorkUnit.status == Status.RUNNING, WorkUnit.lease_owner.is_not(None), WorkUnit.lease_expires_at > now)
        .group_by(WorkUnit.lease_owner)).all()
    return {owner: n for owner, n in rows}


# ---- the rule as one statement -------------------------------------------------------------------------------------

# A measured cold start is the median of this many recent worker sessions that stored a video.
COLD_SESSIONS = 20


def measured_cold_start(s: Session) -> tuple[float, int] | None:
    """(the median cold start of the last COLD_SESSIONS sessions that measured one, how many), or None."""
    found = sorted(s.scalars(select(WorkerSession.cold_start_s).where(WorkerSession.cold_start_s.is_not(None))
                             .order_by(WorkerSession.id.desc()).limit(COLD_SESSIONS)))
    if not found:
        return None
    middle = len(found) // 2
    median = found[middle] if len(found) % 2 else (found[middle - 1] + found[middle]) / 2
    return median, len(found)


def _epoch(dialect: str, column: str) -> str:
    if dialect == "sqlite":  # SQLite keeps DateTime as UTC text; julianday reads it
        return f"((julianday({column}) - 2440587.5) * 86400.0)"
    return f"CAST(EXTRACT(EPOCH FROM {column}) AS DOUBLE PRECISION)"


def _ceil(dialect: str, x: str) -> str:
    x = f"(({x}) - {SLACK})"
    if dialect == "sqlite":  # no CEIL without SQLite's math functions; x >= -SLACK here
        return f"(CAST({x} AS INTEGER) + ({x} > CAST({x} AS INTEGER)))"
    return f"CAST(CEIL({x}) AS INTEGER)"


def _greatest(dialect: str, *xs: str) -> str:
    return ("MAX(" if dialect == "sqlite" else "GREATEST(") + ", ".join(xs) + ")"


SHAPE = ("model", "width", "height", "frames", "steps", "guidance")


def desired_workers_sql(dialect: str = "postgresql", model: str | None = None, horizon_s: float = 600.0,
                        cold_start_s: float = 120.0) -> str:
    """The desired worker count (of `model`, else summed over every model) as one SQL statement with its figures
    written in: for KEDA's PostgreSQL scaler (`dialect` "postgresql") or SQLite."""
    if dialect not in ("postgresql", "sqlite"):
        raise ValueError(f"dialect must be postgresql or sqlite, got {dialect!r}")
    if model is not None and not MODEL_NAME.fullmatch(model):
        raise ValueError(f"not a model name: {model!r}")
    now = _epoch(dialect, "'now'" if dialect == "sqlite" else "now()")
    by_model = f"\n    AND r.model = '{model}'" if model else ""
    shape = ", ".join(SHAPE)
    same = " AND ".join(f"{{a}}.{c} = {{b}}.{c}" for c in SHAPE)
    due = ("(SELECT SUM(c.unit_s) FROM costed c WHERE c.model = d.model AND c.deadline_s <= d.deadline_s)"
           f" / (d.deadline_s - k.now_s - {float(cold_start_s)})")
    return f"""\
WITH clock AS (SELECT {now} AS now_s),
open_units AS (
  SELECT r.model, v.width, v.height, v.frames, v.steps, v.guidance, v.chunks, u.status, u.lease_owner,
         {_epoch(dialect, "u.lease_expires_at")} AS lease_until, {_epoch(dialect, "r.deadline")} AS deadline_s
  FROM work_units u JOIN videos v ON v.id = u.video_id JOIN runs r ON r.id = v.run_id
  WHERE u.status IN ('pending', 'running'){by_model}
),
shapes AS (SELECT DISTINCT {shape} FROM open_units),
recent AS (
  SELECT {", ".join(f"sh.{c}" for c in SHAPE)},
         (SELECT COALESCE(SUM(cr.seconds), 0) FROM cost_records cr WHERE cr.video_id = v.id) AS seconds,
         ROW_NUMBER() OVER (PARTITION BY {", ".join(f"sh.{c}" for c in SHAPE)}
                            ORDER BY v.finished_at DESC, v.id DESC) AS newest
  FROM shapes sh JOIN runs r ON r.model = sh.model
  JOIN videos v ON v.run_id = r.id AND {same.format(a="v", b="sh").replace("v.model = sh.model AND ", "")}
  WHERE v.status = 'succeeded'
),
measured AS (
  SELECT {shape}, AVG(seconds) AS per_video FROM recent WHERE newest <= {RECENT} GROUP BY {shape}
),
costed AS (
  SELECT o.model, o.status, o.lease_owner, o.lease_until, o.deadline_s,
         COALESCE(m.per_video, 0) / o.chunks AS unit_s
  FROM open_units o LEFT JOIN measured m ON {same.format(a="m", b="o")}
),
deadlines AS (
  SELECT DISTINCT c.model, c.deadline_s FROM costed c, clock k
  WHERE c.deadline_s IS NOT NULL AND c.deadline_s - k.now_s > {float(cold_start_s)}
),
deadline_need AS (
  SELECT d.model, MAX({_ceil(dialect, due)}) AS workers
  FROM deadlines d, clock k GROUP BY d.model
),
per_model AS (
  SELECT c.model,
         COUNT(DISTINCT CASE WHEN c.status = 'running' AND c.lease_until > k.now_s THEN c.lease_owner END) AS busy,
         {_ceil(dialect, f"SUM(c.unit_s) / {float(horizon_s)}")} AS backlog,
         COUNT(*) AS units
  FROM costed c, clock k GROUP BY c.model
)
SELECT COALESCE(SUM({_greatest(dialect, "p.busy", "p.backlog", "COALESCE(n.workers, 0)",
                               "CASE WHEN p.units > 0 THEN 1 ELSE 0 END")}), 0) AS desired_workers
FROM per_model p LEFT JOIN deadline_need n ON n.model = p.model"""
