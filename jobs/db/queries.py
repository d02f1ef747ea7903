"""Runs and their videos in the database: the "claimable" query, counts, which models no live worker serves, a run
found by name or id, its report's rows, cancel and resume. Functions take a session factory and return plain values;
a spec becomes rows in jobs.db.submission, claims and leases are in jobs.claims, outcome records in jobs.render."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Row, func, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from jobs.db.base import as_utc, utcnow
from jobs.db.connect import reads
from jobs.db.rows import CostRecord, Run, Video, WorkerSession, WorkUnit
from jobs.db.status import Status
from jobs.errors import RunNotFound, UsageError

Factory = sessionmaker[Session]


def waiting_units() -> tuple:
    """Units waiting their turn: pending, and ready (a long video's later chunk waits for the one before)."""
    return WorkUnit.status == Status.PENDING, WorkUnit.ready.is_(True)


def claimable_units(now: datetime) -> tuple:
    """Units a worker may claim at `now`: waiting, and past their retry backoff. The one "claimable" query, used by
    claims, the sweeper's queue depth and tickets."""
    return *waiting_units(), or_(WorkUnit.not_before.is_(None), WorkUnit.not_before <= now)


def _pending_units(s: Session, run_id: int) -> int:
    return s.scalar(select(func.count()).select_from(WorkUnit).join(Video)
                    .where(Video.run_id == run_id, *waiting_units()))


@dataclass(frozen=True)
class RunCounts:
    run_id: int
    name: str
    model: str
    created_at: datetime
    counts: dict[str, int]
    flagged: int = 0  # videos whose checks flagged them (jobs.render.checks), whatever their status

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> bool:
        return all(Status(k).terminal for k, n in self.counts.items() if n)


def run_counts(factory: Factory, run: str | None = None, owner: tuple = (), limit: int | None = None,
               before: int | None = None) -> list[RunCounts]:
    """Each run's (or `run`'s) video counts by status, in the order of their ids; `owner`: more clauses a run must
    meet (a team's runs); `limit`: only the newest that many of those with an id under `before` (a page)."""
    with factory() as s:
        query = select(Run).where(*owner)
        if run is not None:
            query = query.where(Run.id == _run_id(s, run))
        if before is not None:
            query = query.where(Run.id < before)
        if limit is None:
            runs = list(s.scalars(query.order_by(Run.id)))
        else:
            runs = list(s.scalars(query.order_by(Run.id.desc()).limit(limit)))[::-1]
        rows = s.execute(select(Video.run_id, Video.status, Video.flagged, func.count())
                         .group_by(Video.run_id, Video.status, Video.flagged)
                         .where(Video.run_id.in_([r.id for r in runs]))).all()
    by_run: dict[int, dict[str, int]] = {r.id: {st.value: 0 for st in Status} for r in runs}
    flagged = dict.fromkeys(by_run, 0)
    for run_id, status, flag, n in rows:
        by_run[run_id][Status(status).value] += n
        flagged[run_id] += n if flag else 0
    return [RunCounts(r.id, r.name, r.model, r.created_at, by_run[r.id], flagged[r.id]) for r in runs]


# In a worker session's `models`, a model it would serve but lacks a passing quality gate for (jobs.render.serving.
# gated_models): it claims none of its work. Model names start with a letter or digit, so the mark is never a name's.
UNGATED_MARK = "!"


def _live_models(s: Session, stale_after_s: float) -> list[str | None]:
    return list(s.scalars(select(WorkerSession.models).where(
        WorkerSession.ended_at.is_(None), WorkerSession.last_seen_at >= utcnow() - timedelta(seconds=stale_after_s))))


def unserved_pending(factory: Factory, stale_after_s: float) -> dict[str, int]:
    """Pending videos by model, for each model that no live worker serves: none of the worker sessions that are open
    and heartbeated within `stale_after_s` lists it (a session that lists none is taken to serve every model). That
    work waits; it is never claimed by a worker that cannot render it."""
    with factory() as s:
        live = _live_models(s, stale_after_s)
        if any(models is None for models in live):
            return {}
        served = {m for models in live for m in models.split(",") if m and not m.startswith(UNGATED_MARK)}
        pending = s.execute(select(Run.model, func.count()).join(Video, Video.run_id == Run.id)
                            .where(Video.status == Status.PENDING).group_by(Run.model)).all()
    return {model: n for model, n in sorted(pending) if model not in served}


def ungated_models(factory: Factory, stale_after_s: float) -> set[str]:
    """The models some live worker would serve but lacks a passing quality gate for (UNGATED_MARK)."""
    with factory() as s:
        live = _live_models(s, stale_after_s)
    return {m[len(UNGATED_MARK):] for models in live if models for m in models.split(",")
            if m.startswith(UNGATED_MARK)}


def _run_id(s: Session | Connection, run: str) -> int:
    """A run named by id or by name."""
    found = s.scalar(select(Run.id).where(Run.name == run))
    # '١٢' is a name, never run 12; digits past 2^63 - 1 (a 64-bit id's most) are no run, never an overflow.
    if found is None and run.isascii() and run.isdigit() and len(run) <= 19 and int(run) < 1 << 63:
        found = s.scalar(select(Run.id).where(Run.id == int(run)))
    if found is None:
        raise RunNotFound(f"no run named or numbered {run!r} (see `reelbatch status`)")
    return found


def find_run(factory: Factory, run: str) -> Run:
    """The run row of a run named by name or id (RunNotFound otherwise)."""
    with factory() as s:
        return s.get(Run, _run_id(s, run))
def run_finished(factory: Factory, run: str) -> bool:
    """No video of the run is pending or running: a probe of the (run, status) index, whatever the run's size (each
    worker asks after each batch it records)."""
    with reads(factory)() as s:
        run_id = _run_id(s, run)
        return s.scalar(select(Video.id).where(Video.run_id == run_id,
                                               Video.status.in_([Status.PENDING, Status.RUNNING])).limit(1)) is None


def pending_unit_count(factory: Factory, run: str) -> int:
    with factory() as s:
        return _pending_units(s, _run_id(s, run))


def load_report(factory: Factory, run: str) -> tuple[Run, list[tuple[Row, int]]]:
    """The run row and each video with its summed cost in micro-dollars.

    The videos are plain rows with the `videos` columns as attributes (read like Video objects): building 100,000
    ORM objects was most of a report's time. Each video's cost is summed from its own records through their index,
    so the report takes as long as its run is large, whatever else the table holds (a join over the whole table
    read every record there; docs/SCALE.md). `attempts` is report_attempts' count, not the column's."""
    with factory() as s:
        run_id = _run_id(s, run)
        row = s.get(Run, run_id)
        videos = s.execute(_entries().where(Video.run_id == run_id).order_by(Video.id)).all()
        return row, [(v, int(v.cost_micro_usd)) for v in videos]


def video_page(factory: Factory, run: str, states: tuple[str, ...] = (), flagged: bool | None = None,
               after: int = 0, limit: int = 100) -> list[tuple[Row, int]]:
    """Up to `limit` of a run's videos in the order they were submitted, after the one whose row id is `after`,
    with their summed costs (as load_report's rows): those in `states` (any when empty), flagged or needs_review
    when `flagged` is true (neither when false). Read through the run's (run_id, status) index and the primary key,
    so a page of a 100,000-video run costs what a page of a small one does."""
    with factory() as s:
        query = _entries().where(Video.run_id == _run_id(s, run), Video.id > after)
        if states:
            query = query.where(Video.status.in_([Status(x) for x in states]))
        if flagged is not None:
            either = or_(Video.flagged, Video.needs_review)
            query = query.where(either if flagged else ~either)
        videos = s.execute(query.order_by(Video.id).limit(limit)).all()
        return [(v, int(v.cost_micro_usd)) for v in videos]


def _entries():
    """A report's rows: every `videos` column but attempts, then report_attempts' count and the summed cost."""
    cost = (select(func.coalesce(func.sum(CostRecord.amount_micro_usd), 0))
            .where(CostRecord.video_id == Video.id).scalar_subquery())
    columns = [c for c in Video.__table__.columns if c.name != "attempts"]
    return select(*columns, report_attempts().label("attempts"), cost.label("cost_micro_usd"))


def report_attempts():
    """A video's attempts as its report states them: one, plus each retry of any of its chunks (0 if never claimed).
    The `attempts` column counts every chunk's claim, so a long video of three chunks rendered once holds 3 there: a
    chunk is not an attempt. Summed from its units through their (video, chunk) index; jobs.reports.postgres writes
    the same sum in SQL."""
    return (select(func.coalesce(func.sum(WorkUnit.attempts) - func.count() + 1, 0))
            .where(WorkUnit.video_id == Video.id, WorkUnit.attempts > 0).scalar_subquery())


def cancel_run(factory: Factory, run: str) -> tuple[str, int]:
    """Cancel a run: its pending work is cancelled now, running batches stop at their next step boundary.

    Idempotent: cancelling a cancelled run changes nothing. Returns the run name and how many videos were cancelled.
    Two statements whatever the run's size (a 100,000-video cancel took 70 s one row at a time): the units, their
    own status the condition (a unit a worker claims meanwhile is left to it: PostgreSQL rechecks the condition on
    the row it waited for), then their videos.
    """
    with factory.begin() as s:
        row = s.get(Run, _run_id(s, run))
        if row.cancelled_at is None:
            row.cancelled_at = utcnow()
        # A long video's later chunks are pending but not ready: its ready unit speaks for the video.
        videos = _move_units(s, row.id, waiting_units(), Status.CANCELLED, lease_owner=None, lease_expires_at=None)
        _move_videos(s, videos, Status.CANCELLED, finished_at=utcnow())
        return row.name, len(videos)


def resume_run(factory: Factory, run: str) -> tuple[str, int]:
    """Put a run's failed and cancelled videos back to pending, with fresh attempts. Idempotent.

    Returns the run name and how many videos were resumed (the caller sends that many tickets). A resume that puts
    videos back starts the run's next round, so its next finish is notified again (jobs.notify). A run past its
    deadline is refused: its videos would be cancelled again at once.
    """
    with factory.begin() as s:
        row = s.get(Run, _run_id(s, run))
        if row.deadline is not None and as_utc(row.deadline) <= utcnow():
            raise UsageError(f"run {row.name} passed its deadline ({as_utc(row.deadline):%Y-%m-%dT%H:%M:%SZ}): "
                             "nothing of it starts any more; submit its videos again as a new run (--new-run)")
        row.cancelled_at = row.budget_reached_at = None
        resumed = requeue(s, row.id, (WorkUnit.status.in_([Status.FAILED, Status.CANCELLED]),))
        if resumed:
            row.round += 1
        return row.name, resumed


def requeue(s: Session, run_id: int, where: tuple) -> int:
    """The run's units matching `where` (failed or cancelled ones) and their videos back to pending, with fresh
    attempts and no cancel reason; how many videos. Set-based, as cancel_run."""
    videos = _move_units(s, run_id, where, Status.PENDING, attempts=0, not_before=None, solo=False)
    _move_videos(s, videos, Status.PENDING, attempts=0, finished_at=None, cancel_reason=None)
    return len(videos)


# Ids one statement names: under SQLite's limit of bound parameters (32,766).
_IDS_AT_ONCE = 10_000


def _move_units(s: Session, run_id: int, where: tuple, new: Status, **values) -> list[int]:
    """One UPDATE of the run's units matching `where` (every status they may hold must be allowed to move to `new`
    by jobs.db.status.TRANSITIONS: the callers' conditions say which); the ids of their videos, each once."""
    moved = s.execute(update(WorkUnit)
                      .where(WorkUnit.video_id.in_(select(Video.id).where(Video.run_id == run_id)), *where)
                      .values(status=new, updated_at=utcnow(), **values).returning(WorkUnit.video_id)
                      .execution_options(synchronize_session=False))
    return sorted(set(moved.scalars()))


def _move_videos(s: Session, ids: list[int], new: Status, **values) -> None:
    for start in range(0, len(ids), _IDS_AT_ONCE):
        s.execute(update(Video).where(Video.id.in_(ids[start:start + _IDS_AT_ONCE]))
                  .values(status=new, updated_at=utcnow(), **values).execution_options(synchronize_session=False))

