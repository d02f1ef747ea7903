"""Taking work: a worker claims a same-shape batch of claimable units, each a lease (jobs.work.leases).

Claimable (jobs.db.queries.claimable_units): pending, its turn (a long video's next chunk waits for the one before),
past its retry backoff. The best claimable unit (highest rank: jobs.db.queries.unit_rank) decides the batch's shape,
and as many units of that shape as the worker's max batch join it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select

from engine.types import RenderBatch, RenderRequest, Shape
from jobs.db.queries import Factory, claimable_units, waiting_units
from jobs.db.rows import Run, Video, WorkUnit, utcnow
from jobs.db.status import Status, move


@dataclass(frozen=True)
class ClaimedUnit:
    unit_id: int
    token: int
    video_id: int
    run_id: int
    key: str
    run_name: str
    output: str
    seed: int
    fps: int
    frames: int
    attempts: int
    # The checksum an earlier attempt was about to upload, if any (jobs.render.record.mark_uploading).
    upload_sha256: str | None = None
    # A long video's chunk (engine.chunks): which one, of how many, sharing how many latent frames.
    chunk: int = 0
    chunks: int = 1
    chunk_overlap: int = 0
    # The video's image (jobs.render.images reads it for its first chunk): URI, SHA-256 at submit, fit.
    image_uri: str | None = None
    image_sha256: str | None = None
    image_fit: str | None = None

    @property
    def chunked(self) -> bool:
        return self.chunks > 1

    @property
    def last_chunk(self) -> bool:
        return self.chunk == self.chunks - 1


@dataclass(frozen=True)
class Claim:
    batch: RenderBatch
    units: tuple[ClaimedUnit, ...]


def claim_batch(factory: Factory, *, owner: str, max_batch: int, lease_s: float) -> Claim | None:
    """Atomically take up to `max_batch` claimable units of one shape: the shape of the best claimable unit.

    A unit marked solo (its batch failed before) is claimed alone. On PostgreSQL both selects use FOR UPDATE SKIP
    LOCKED, so concurrent workers take disjoint units without waiting; on SQLite the transaction is BEGIN IMMEDIATE
    (jobs.db.connect).
    """
    now = utcnow()
    claimable = claimable_units(now)
    order = (WorkUnit.rank.desc(), WorkUnit.id)
    with factory.begin() as s:
        first = s.scalar(select(WorkUnit).where(*claimable).order_by(*order).limit(1)
                         .with_for_update(skip_locked=True))
        if first is None:
            return None
        units = [first]
        if not first.solo and max_batch > 1:
            units += s.scalars(select(WorkUnit).where(*claimable, WorkUnit.shape_key == first.shape_key,
                                                      WorkUnit.solo.is_(False), WorkUnit.id != first.id)
                               .order_by(*order).limit(max_batch - 1).with_for_update(skip_locked=True))
        videos = {v.id: v for v in s.scalars(select(Video).where(Video.id.in_([u.video_id for u in units])))}
        runs = {r.id: r for r in s.scalars(select(Run).where(Run.id.in_({v.run_id for v in videos.values()})))}
        claimed = []
        for unit in units:
            video = videos[unit.video_id]
            move(unit, video, Status.RUNNING)
            unit.attempts += 1
            video.attempts += 1
            unit.lease_owner, unit.lease_token = owner, unit.lease_token + 1
            unit.lease_expires_at = now + timedelta(seconds=lease_s)
            if unit.chunk == 0:  # a long video started with its first chunk
                video.started_at = now
            claimed.append((unit, video, runs[video.run_id]))
        s.flush()
        u0, v0, run0 = claimed[0]
        shape = Shape(run0.model, v0.width, v0.height, u0.frames, v0.steps, v0.guidance)
        return Claim(
            RenderBatch(shape, tuple(RenderRequest(v.id, v.prompt, v.negative_prompt, v.seed) for _, v, _ in claimed)),
            tuple(ClaimedUnit(u.id, u.lease_token, v.id, r.id, v.key, r.name, r.output, v.seed, v.fps, v.frames,
                              u.attempts, v.upload_sha256, u.chunk, v.chunks, v.chunk_overlap, v.image_uri,
                              v.image_sha256, v.image_fit)
                  for u, v, r in claimed),
        )


def claimable_count(factory: Factory) -> int:
    """How many units a worker could claim now."""
    with factory() as s:
        return s.scalar(select(func.count()).select_from(WorkUnit).where(*claimable_units(utcnow())))


def any_claimable(factory: Factory) -> bool:
    """Is any unit waiting that a worker could claim now?"""
    with factory() as s:
        return s.scalar(select(WorkUnit.id).where(*claimable_units(utcnow())).limit(1)) is not None


def waiting_shapes(factory: Factory, limit: int = 4) -> list[tuple[Shape, int]]:
    """The shapes of waiting work (backoff or not), with how many units wait in each, the most first."""
    count = func.count(WorkUnit.id)
    columns = (Run.model, Video.width, Video.height, WorkUnit.frames, Video.steps, Video.guidance)
    with factory() as s:
        rows = s.execute(select(*columns, count).join(Video, WorkUnit.video_id == Video.id)
                         .join(Run, Video.run_id == Run.id).where(*waiting_units())
                         .group_by(*columns).order_by(count.desc()).limit(limit)).all()
    return [(Shape(*row[:6]), row[6]) for row in rows]
