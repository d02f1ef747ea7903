"""Runs and their videos in the database: a checked spec recorded as rows (submit_run), the "claimable" query, counts,
reports, cancel and resume. Functions take a session factory and return plain values; claims, leases and outcome
records are in jobs.work and jobs.render."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from engine.types import Shape
from jobs.db.rows import CostRecord, Run, Video, WorkUnit, utcnow
from jobs.db.status import Status, move
from jobs.errors import RunNameTaken, RunNotFound
from jobs.manifest import RunSpec, derive_seed

Factory = sessionmaker[Session]

# Waiting work gains one priority level every AGING_S seconds, so no run is starved by newer high-priority work.
AGING_S = 600


def unit_rank(priority: int, submitted: datetime) -> int:
    """Claim order, highest first: a unit of priority p submitted at t ranks p x AGING_S - t.

    A priority-9 unit submitted now outranks a priority-0 unit only while that one is less than 9 x 600 s = 90
    minutes old; among equal priorities the oldest goes first.
    """
    return priority * AGING_S - int(submitted.timestamp())


@dataclass(frozen=True)
class Submitted:
    run_id: int
    name: str
    videos: int
    created: bool
    pending_units: int


def submit_run(factory: Factory, spec: RunSpec, *, output: str, new_run: bool = False) -> Submitted:
    """Record a validated run and its videos and work units, in one transaction.

    Same name and same content: the existing run (idempotent). Same name, other content: refused, so no run can
    write over another's videos. `new_run`: always a new run, named `NAME-2`, `NAME-3`, ... when the name is taken.
    """
    content = hashlib.sha256(f"{spec.content_sha256}\0{output}".encode()).hexdigest()
    with factory.begin() as s:
        existing = s.scalar(select(Run).where(Run.name == spec.name))
        name = spec.name
        if existing is not None and not new_run:
            if existing.content_sha256 != content:
                raise RunNameTaken(
                    f"run name {spec.name!r} is already used by run {existing.id} with different content "
                    f"(from {existing.source}); rename the run or pass --new-run"
                )
            return Submitted(existing.id, existing.name, _count(s, Video, existing.id), False,
                             _pending_units(s, existing.id))
        if existing is not None:
            name = _free_name(s, spec.name)
        now = utcnow()
        run = Run(name=name, model=spec.model, output=output, priority=spec.priority, source=spec.source,
                  content_sha256=content)
        s.add(run)
        s.flush()
        videos = [Video(run_id=run.id, key=v.id, line=v.line, prompt=v.prompt, negative_prompt=v.negative_prompt,
                        seed=v.seed if v.seed is not None else derive_seed(name, v.id), width=v.width,
                        height=v.height, frames=v.frames, fps=v.fps, duration_s=v.duration_s, steps=v.steps,
                        guidance=v.guidance, status=Status.PENDING, chunks=v.chunks, chunk_overlap=v.chunk_overlap,
                        image_uri=v.image, image_sha256=v.image_sha256, image_fit=v.fit)
                  for v in spec.videos]
        s.add_all(videos)
        s.flush()  # one round of inserts for the ids the units point at
        rank = unit_rank(spec.priority, now)
        # A long video's chunks are units of the window's shape, so they batch with short videos of that shape;
        # only chunk 0 is ready, each later one when the one before it has finished. A video's image starts its
        # chunk 0, which batches apart from text-only work when the model says so.
        s.add_all(WorkUnit(video_id=video.id, chunk=k, frames=v.window, ready=k == 0, priority=spec.priority,
                           rank=rank, status=Status.PENDING,
                           shape_key=Shape(spec.model, v.width, v.height, v.window, v.steps, v.guidance,
                                           image=spec.separate_image_batches and v.image is not None and k == 0).key())
                  for video, v in zip(videos, spec.videos) for k in range(v.chunks))
        return Submitted(run.id, name, len(spec.videos), True, len(spec.videos))


def _count(s: Session, model, run_id: int) -> int:
    return s.scalar(select(func.count()).select_from(model).where(model.run_id == run_id))


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


def _free_name(s: Session, base: str) -> str:
    taken = set(s.scalars(select(Run.name).where(Run.name.like(f"{base}-%"))))
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


@dataclass(frozen=True)
class RunCounts:
    run_id: int
    name: str
    model: str
    created_at: datetime
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> bool:
        return all(Status(k).terminal for k, n in self.counts.items() if n)


def run_counts(factory: Factory, run: str | None = None) -> list[RunCounts]:
    with factory() as s:
        query = select(Run).order_by(Run.id)
        if run is not None:
            query = query.where(Run.id == _run_id(s, run))
        runs = list(s.scalars(query))
        rows = s.execute(select(Video.run_id, Video.status, func.count()).group_by(Video.run_id, Video.status)
                         .where(Video.run_id.in_([r.id for r in runs]))).all()
    by_run: dict[int, dict[str, int]] = {r.id: {st.value: 0 for st in Status} for r in runs}
    for run_id, status, n in rows:
        by_run[run_id][Status(status).value] = n
    return [RunCounts(r.id, r.name, r.model, r.created_at, by_run[r.id]) for r in runs]


def _run_id(s: Session, run: str) -> int:
    """A run named by id or by name."""
    found = s.scalar(select(Run.id).where(Run.name == run))
    if found is None and run.isdigit():
        found = s.scalar(select(Run.id).where(Run.id == int(run)))
    if found is None:
        raise RunNotFound(f"no run named or numbered {run!r} (see `reelbatch status`)")
    return found


def pending_unit_count(factory: Factory, run: str) -> int:
    with factory() as s:
        return _pending_units(s, _run_id(s, run))


def load_report(factory: Factory, run: str) -> tuple[Run, list[tuple[Video, int]]]:
    """The run row and each video with its summed cost in micro-dollars."""
    with factory() as s:
        run_id = _run_id(s, run)
        row = s.get(Run, run_id)
        cost = (select(CostRecord.video_id, func.sum(CostRecord.amount_micro_usd).label("micro"))
                .group_by(CostRecord.video_id).subquery())
        videos = s.execute(select(Video, func.coalesce(cost.c.micro, 0)).outerjoin(cost, cost.c.video_id == Video.id)
                           .where(Video.run_id == run_id).order_by(Video.id)).all()
        return row, [(v, int(m)) for v, m in videos]


def cancel_run(factory: Factory, run: str) -> tuple[str, int]:
    """Cancel a run: its pending work is cancelled now, running batches stop at their next step boundary.

    Idempotent: cancelling a cancelled run changes nothing. Returns the run name and how many videos were cancelled.
    """
    with factory.begin() as s:
        row = s.get(Run, _run_id(s, run))
        if row.cancelled_at is None:
            row.cancelled_at = utcnow()
        # A long video's later chunks are pending but not ready: its ready unit speaks for the video.
        units = list(s.scalars(select(WorkUnit).join(Video).where(Video.run_id == row.id, *waiting_units())
                               .with_for_update()))
        for unit in units:
            video = s.get(Video, unit.video_id)
            move(unit, video, Status.CANCELLED)
        return row.name, len(units)


def resume_run(factory: Factory, run: str) -> tuple[str, int]:
    """Put a run's failed and cancelled videos back to pending, with fresh attempts. Idempotent.

    Returns the run name and how many videos were resumed (the caller sends that many tickets).
    """
    with factory.begin() as s:
        row = s.get(Run, _run_id(s, run))
        row.cancelled_at = None
        units = list(s.scalars(select(WorkUnit).join(Video).where(
            Video.run_id == row.id, WorkUnit.status.in_([Status.FAILED, Status.CANCELLED])).with_for_update()))
        for unit in units:
            video = s.get(Video, unit.video_id)
            move(unit, video, Status.PENDING)
            unit.attempts = video.attempts = 0
            unit.not_before, unit.solo, video.finished_at = None, False, None
        return row.name, len(units)
