"""Runs and their videos in the database: a checked spec recorded as rows (submit_run), the "claimable" query, counts,
reports, cancel and resume. Functions take a session factory and return plain values; claims, leases and outcome
records are in jobs.work and jobs.render."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Row, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from engine.types import Shape
from jobs.db.bulk import insert_rows
from jobs.db.connect import reads
from jobs.db.rows import CostRecord, Run, Team, Video, WorkerSession, WorkUnit, as_utc, utcnow
from jobs.db.status import Status, move
from jobs.errors import RunNameTaken, RunNotFound, UsageError
from jobs.manifest import RunSpec, derive_seed
from jobs.manifest.fields import MAX_NAME_CHARS
from jobs.manifest.room import run_name_problem, video_id_problem

Factory = sessionmaker[Session]

# Waiting work gains one priority level every AGING_S seconds, so no run is starved by newer high-priority work.
AGING_S = 600
# A run with a deadline queues as if it had been submitted this long before its deadline (when that is earlier than
# its submission): runs without one count as due this long after they were submitted. 12 hours covers a night's
# window (a manifest submitted at 22:00 for 08:00), so overnight runs of one priority go earliest deadline first.
DEADLINE_LEAD_S = 12 * 3600


def unit_rank(priority: int, submitted: datetime, deadline: datetime | None = None) -> int:
    """Claim order, highest first: a unit of priority p submitted at t ranks p x AGING_S - t.

    A priority-9 unit submitted now outranks a priority-0 unit only while that one is less than 9 x 600 s = 90
    minutes old; among equal priorities the oldest goes first. With a deadline d, t is min(t, d - DEADLINE_LEAD_S):
    within a priority, earlier deadlines go first (one column, so the claim index still serves the order). The credit
    counts like waiting time, so a run due soon also passes higher priorities, a level per AGING_S of credit.
    """
    queued = submitted.timestamp()
    if deadline is not None:
        queued = min(queued, deadline.timestamp() - DEADLINE_LEAD_S)
    return priority * AGING_S - int(queued)


@dataclass(frozen=True)
class Submitted:
    run_id: int
    name: str
    videos: int
    created: bool
    pending_units: int
    model: str


def submit_run(factory: Factory, spec: RunSpec, *, output: str, new_run: bool = False,
               team_id: int | None = None) -> Submitted:
    """Record a validated run and its videos and work units, in one transaction.

    Same name and same content: the existing run (idempotent). Same name, other content: refused, so no run can
    write over another's videos. `new_run`: always a new run, named `NAME-2`, `NAME-3`, ... when the name is taken.
    `team_id`: the team it belongs to (None: the default team, jobs.db.teams); a name another team's run holds is
    refused without a word of that run.
    """
    content = hashlib.sha256(f"{spec.content_sha256}\0{output}".encode()).hexdigest()
    with factory.begin() as s:
        team_id = default_team_id(s) if team_id is None else team_id
        existing = s.scalar(select(Run).where(Run.name == spec.name))
        name = spec.name
        if existing is not None and not new_run and (existing.team_id or default_team_id(s)) != team_id:
            raise RunNameTaken(f"run name {spec.name!r} is taken; pick another name or pass --new-run")
        if existing is not None and not new_run:
            if existing.content_sha256 != content:
                raise RunNameTaken(
                    f"run name {spec.name!r} is already used by run {existing.id} with different content "
                    f"(from {existing.source}); rename the run or pass --new-run"
                )
            return Submitted(existing.id, existing.name, _count(s, Video, existing.id), False,
                             _pending_units(s, existing.id), existing.model)
        if existing is not None:
            name = _free_name(s, spec.name)
            _check_new_name(name, spec, output)
        now = utcnow()
        run = Run(name=name, model=spec.model, output=output, priority=spec.priority, source=spec.source,
                  content_sha256=content, notify_url=spec.notify, codec=spec.encoding.codec, crf=spec.encoding.crf,
                  preset=spec.encoding.preset, deadline=spec.deadline, checks_on_fail=spec.on_fail,
                  max_cost_micro_usd=None if spec.max_cost_usd is None else round(spec.max_cost_usd * 1e6),
                  team_id=team_id)
        s.add(run)
        s.flush()
        # Plain rows in bulk (jobs.db.bulk), not ORM objects: a 100,000-video run's objects took the client longer
        # than the server's idle-in-transaction timeout (jobs.db.connect) to build on a loaded machine, and the
        # server ended the transaction (docs/SCALE.md).
        insert_rows(s, Video, [dict(
            run_id=run.id, key=v.id, line=v.line, prompt=v.prompt, negative_prompt=v.negative_prompt,
            seed=v.seed if v.seed is not None else derive_seed(name, v.id), width=v.width, height=v.height,
            frames=v.frames, fps=v.fps, duration_s=v.duration_s, steps=v.steps, guidance=v.guidance,
            status=Status.PENDING, chunks=v.chunks, chunk_overlap=v.chunk_overlap, image_uri=v.image,
            image_sha256=v.image_sha256, image_fit=v.fit) for v in spec.videos])
        ids = dict(s.execute(select(Video.key, Video.id).where(Video.run_id == run.id)).all())
        rank = unit_rank(spec.priority, now, spec.deadline)
        # A long video's chunks are units of the window's shape, so they batch with short videos of that shape;
        # only chunk 0 is ready, each later one when the one before it has finished. A video's image starts its
        # chunk 0, which batches apart from text-only work when the model says so.
        insert_rows(s, WorkUnit, [dict(
            video_id=ids[v.id], chunk=k, frames=v.window, ready=k == 0, priority=spec.priority, rank=rank,
            status=Status.PENDING, model=spec.model, team_id=team_id,
            shape_key=Shape(spec.model, v.width, v.height, v.window, v.steps, v.guidance,
                            image=spec.separate_image_batches and v.image is not None and k == 0).key())
            for v in spec.videos for k in range(v.chunks)])
        return Submitted(run.id, name, len(spec.videos), True, len(spec.videos), spec.model)


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


def _check_new_name(name: str, spec: RunSpec, output: str) -> None:
    """A `--new-run` name must hold what the manifest's name held: 128 characters, and every key under `output`."""
    problem = (f"is {len(name)} characters, over the {MAX_NAME_CHARS}-character limit of a run name"
               if len(name) > MAX_NAME_CHARS else run_name_problem(output, name))
    for video in spec.videos if problem is None else ():
        if (why := video_id_problem(output, name, video.id, video.chunks)) is not None:
            problem = f"does not leave room for id {video.id!r}, which {why}"
            break
    if problem is not None:
        raise UsageError(f"--new-run: run name {spec.name!r} is taken, and the next free name {name!r} {problem}; "
                         f"pass a shorter --name")


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
    flagged: int = 0  # videos whose checks flagged them (jobs.render.checks), whatever their status

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> bool:
        return all(Status(k).terminal for k, n in self.counts.items() if n)


def run_counts(factory: Factory, run: str | None = None, owner: tuple = ()) -> list[RunCounts]:
    """Each run's (or `run`'s) video counts by status; `owner`: more clauses a run must meet (a team's runs)."""
    with factory() as s:
        query = select(Run).where(*owner).order_by(Run.id)
        if run is not None:
            query = query.where(Run.id == _run_id(s, run))
        runs = list(s.scalars(query))
        rows = s.execute(select(Video.run_id, Video.status, Video.flagged, func.count())
                         .group_by(Video.run_id, Video.status, Video.flagged)
                         .where(Video.run_id.in_([r.id for r in runs]))).all()
    by_run: dict[int, dict[str, int]] = {r.id: {st.value: 0 for st in Status} for r in runs}
    flagged = dict.fromkeys(by_run, 0)
    for run_id, status, flag, n in rows:
        by_run[run_id][Status(status).value] += n
        flagged[run_id] += n if flag else 0
    return [RunCounts(r.id, r.name, r.model, r.created_at, by_run[r.id], flagged[r.id]) for r in runs]


# In a worker session's `models`, a model it would serve but lacks a passing quality gate for (jobs.render.batch.
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


# The team CLI runs belong to (jobs.db.teams); the migration makes it.
DEFAULT_TEAM = "default"


def default_team_id(s: Session) -> int:
    """The default team's id, made on first use (the migration makes it; a database made otherwise may lack it)."""
    found = s.scalar(select(Team.id).where(Team.name == DEFAULT_TEAM))
    if found is None:
        team = Team(name=DEFAULT_TEAM, share=1.0)
        s.add(team)
        s.flush()
        found = team.id
    return found


def ungated_models(factory: Factory, stale_after_s: float) -> set[str]:
    """The models some live worker would serve but lacks a passing quality gate for (UNGATED_MARK)."""
    with factory() as s:
        live = _live_models(s, stale_after_s)
    return {m[len(UNGATED_MARK):] for models in live if models for m in models.split(",")
            if m.startswith(UNGATED_MARK)}


def _run_id(s: Session | Connection, run: str) -> int:
    """A run named by id or by name."""
    found = s.scalar(select(Run.id).where(Run.name == run))
    if found is None and run.isascii() and run.isdigit():  # '١٢' is a name, never run 12
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
    read every record there; docs/SCALE.md)."""
    with factory() as s:
        run_id = _run_id(s, run)
        row = s.get(Run, run_id)
        cost = (select(func.coalesce(func.sum(CostRecord.amount_micro_usd), 0))
                .where(CostRecord.video_id == Video.id).scalar_subquery())
        videos = s.execute(select(*Video.__table__.columns, cost.label("cost_micro_usd"))
                           .where(Video.run_id == run_id).order_by(Video.id)).all()
        return row, [(v, int(v.cost_micro_usd)) for v in videos]


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
        units = list(s.scalars(select(WorkUnit).join(Video).where(
            Video.run_id == row.id, WorkUnit.status.in_([Status.FAILED, Status.CANCELLED])).with_for_update()))
        requeue(s, units)
        if units:
            row.round += 1
        return row.name, len(units)


def requeue(s: Session, units: list[WorkUnit]) -> None:
    """Failed or cancelled units (and their videos) back to pending, with fresh attempts and no cancel reason."""
    for unit in units:
        video = s.get(Video, unit.video_id)
        move(unit, video, Status.PENDING)
        unit.attempts = video.attempts = 0
        unit.not_before, unit.solo, video.finished_at, video.cancel_reason = None, False, None, None
