"""Every read and write of the job tables. Functions take a session factory and return plain values."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from engine.types import RenderBatch, RenderRequest, Shape
from jobs.errors import RunNameTaken, RunNotFound
from jobs.manifest import RunSpec, derive_seed
from jobs.models import CostRecord, Run, Video, WorkUnit, utcnow
from jobs.status import Status, transition

Factory = sessionmaker[Session]


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
        run = Run(name=name, model=spec.model, output=output, priority=spec.priority, source=spec.source,
                  content_sha256=content)
        s.add(run)
        s.flush()
        for v in spec.videos:
            video = Video(run_id=run.id, key=v.id, line=v.line, prompt=v.prompt, negative_prompt=v.negative_prompt,
                          seed=v.seed if v.seed is not None else derive_seed(name, v.id), width=v.width,
                          height=v.height, frames=v.frames, fps=v.fps, duration_s=v.duration_s, steps=v.steps,
                          guidance=v.guidance, status=Status.PENDING)
            s.add(video)
            s.flush()
            shape = Shape(spec.model, v.width, v.height, v.frames, v.steps, v.guidance)
            s.add(WorkUnit(video_id=video.id, chunk=0, shape_key=shape.key(), priority=spec.priority,
                           status=Status.PENDING))
        return Submitted(run.id, name, len(spec.videos), True, len(spec.videos))


def _count(s: Session, model, run_id: int) -> int:
    return s.scalar(select(func.count()).select_from(model).where(model.run_id == run_id))


def _pending_units(s: Session, run_id: int) -> int:
    return s.scalar(select(func.count()).select_from(WorkUnit).join(Video)
                    .where(Video.run_id == run_id, WorkUnit.status == Status.PENDING))


def _free_name(s: Session, base: str) -> str:
    taken = set(s.scalars(select(Run.name).where(Run.name.like(f"{base}-%"))))
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


@dataclass(frozen=True)
class ClaimedUnit:
    unit_id: int
    token: int
    video_id: int
    key: str
    run_name: str
    output: str
    seed: int
    fps: int
    frames: int


@dataclass(frozen=True)
class Claim:
    batch: RenderBatch
    units: tuple[ClaimedUnit, ...]


def claim_batch(factory: Factory, *, owner: str, max_batch: int, lease_s: float) -> Claim | None:
    """Atomically take up to `max_batch` pending units of one shape: the shape of the best pending unit.

    Best = highest priority, then oldest. On PostgreSQL both selects use FOR UPDATE SKIP LOCKED, so concurrent
    workers take disjoint units without waiting; on SQLite the transaction is BEGIN IMMEDIATE (see jobs.db), which
    serialises claims. Each claim is a lease with an expiry and a fresh fencing token.
    """
    order = (WorkUnit.priority.desc(), WorkUnit.id)
    pending = WorkUnit.status == Status.PENDING
    with factory.begin() as s:
        first = s.scalar(select(WorkUnit.shape_key).where(pending).order_by(*order).limit(1)
                         .with_for_update(skip_locked=True))
        if first is None:
            return None
        units = list(s.scalars(select(WorkUnit).where(pending, WorkUnit.shape_key == first).order_by(*order)
                               .limit(max_batch).with_for_update(skip_locked=True)))
        if not units:
            return None
        videos = {v.id: v for v in s.scalars(select(Video).where(Video.id.in_([u.video_id for u in units])))}
        runs = {r.id: r for r in s.scalars(select(Run).where(Run.id.in_({v.run_id for v in videos.values()})))}
        now = utcnow()
        claimed = []
        for unit in units:
            video, run = videos[unit.video_id], runs[videos[unit.video_id].run_id]
            transition(unit, Status.RUNNING)
            unit.attempts += 1
            unit.lease_owner = owner
            unit.lease_token += 1
            unit.lease_expires_at = now + timedelta(seconds=lease_s)
            transition(video, Status.RUNNING)
            video.attempts += 1
            video.started_at = now
            claimed.append((unit, video, run))
        s.flush()
        v0, run0 = claimed[0][1], claimed[0][2]
        shape = Shape(run0.model, v0.width, v0.height, v0.frames, v0.steps, v0.guidance)
        requests = tuple(RenderRequest(v.id, v.prompt, v.negative_prompt, v.seed) for _, v, _ in claimed)
        return Claim(
            RenderBatch(shape, requests),
            tuple(ClaimedUnit(u.id, u.lease_token, v.id, v.key, r.name, r.output, v.seed, v.fps, v.frames)
                  for u, v, r in claimed),
        )


@dataclass(frozen=True)
class VideoOutput:
    uri: str
    bytes: int
    sha256: str
    render_s: float
    encode_s: float
    upload_s: float


@dataclass(frozen=True)
class Rate:
    usd_per_hour: float
    source: str


def _fenced(s: Session, unit: ClaimedUnit) -> tuple[WorkUnit, Video] | None:
    """The unit and video rows, locked, if this worker still holds the lease; else None (the write is refused)."""
    row = s.scalar(select(WorkUnit).where(WorkUnit.id == unit.unit_id).with_for_update())
    if row is None or row.lease_token != unit.token or row.status != Status.RUNNING:
        return None
    return row, s.get(Video, row.video_id, with_for_update=True)


def record_success(factory: Factory, unit: ClaimedUnit, out: VideoOutput, rate: Rate) -> bool:
    """Mark one video succeeded with its output and its cost record. False if the lease was lost."""
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        transition(row, Status.SUCCEEDED)
        row.lease_owner, row.lease_expires_at = None, None
        transition(video, Status.SUCCEEDED)
        video.uri, video.bytes, video.sha256 = out.uri, out.bytes, out.sha256
        video.render_s, video.encode_s, video.upload_s = out.render_s, out.encode_s, out.upload_s
        video.finished_at = utcnow()
        video.last_error = None
        seconds = out.render_s + out.encode_s + out.upload_s
        s.add(CostRecord(video_id=video.id, kind="gpu", seconds=seconds, rate_usd_per_hour=rate.usd_per_hour,
                         rate_source=rate.source, amount_micro_usd=round(seconds * rate.usd_per_hour / 3600 * 1e6)))
        return True


def record_failure(factory: Factory, unit: ClaimedUnit, error: str) -> bool:
    """Mark one video failed with its error. False if the lease was lost."""
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        transition(row, Status.FAILED)
        row.lease_owner, row.lease_expires_at = None, None
        transition(video, Status.FAILED)
        video.last_error = error[:4000]
        video.finished_at = utcnow()
        return True


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
