"""A checked spec recorded as rows (submit_run): the run, its videos and their work units in one transaction, each unit
ranked for the claim (unit_rank), the run in its team (the default team for the CLI's runs). Idempotent by name and
content."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from engine.types import Shape
from jobs.db.base import utcnow
from jobs.db.bulk import insert_rows
from jobs.db.queries import Factory, _pending_units
from jobs.db.rows import Run, Video, WorkUnit
from jobs.db.service_rows import Team
from jobs.db.status import Status
from jobs.errors import RunNameTaken, UsageError
from jobs.manifest import RunSpec, derive_seed
from jobs.manifest.fields import MAX_NAME_CHARS
from jobs.manifest.room import run_name_problem, video_id_problem

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
    # Set by jobs.usecases.submit when the run is recorded but its tickets could not be sent: what the broker said.
    unqueued: str | None = None


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
