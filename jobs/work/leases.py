"""Claims as leases: take work, hold it, give it back, and record results, fenced by a token.

The database is the source of truth. A claim sets each unit's lease (owner, expiry, a token that grows with every
claim). The worker renews the lease while it renders; every write it makes afterwards presents its token and changes
nothing if the token is stale (its lease expired and the reaper handed the unit to someone else). The reaper puts
expired units back to pending, so a killed or frozen worker never holds work for longer than one lease.
Lease times come from the workers' clocks: keep them NTP-synchronised (leases are minutes, skew is milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from engine.types import RenderBatch, RenderRequest, Shape
from jobs.cost.ledger import Rate, charge
from jobs.db.rows import CostRecord, Run, Video, WorkUnit, utcnow
from jobs.db.queries import Factory
from jobs.db.status import Status, move, transition


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
    # The checksum an earlier attempt was about to upload, if any (see mark_uploading).
    upload_sha256: str | None = None
    # A long video's chunk (engine.chunks): which one, of how many, sharing how many latent frames.
    chunk: int = 0
    chunks: int = 1
    chunk_overlap: int = 0

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

    Best = highest rank (jobs.db.queries.unit_rank). Claimable = pending and past its retry backoff. A unit marked solo
    (its batch failed before) is claimed alone. On PostgreSQL both selects use FOR UPDATE SKIP LOCKED, so concurrent
    workers take disjoint units without waiting; on SQLite the transaction is BEGIN IMMEDIATE (see jobs.db.connect).
    """
    now = utcnow()
    claimable = (WorkUnit.status == Status.PENDING, WorkUnit.ready.is_(True),
                 or_(WorkUnit.not_before.is_(None), WorkUnit.not_before <= now))
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
                              u.attempts, v.upload_sha256, u.chunk, v.chunks, v.chunk_overlap)
                  for u, v, r in claimed),
        )


def _fenced(s: Session, unit: ClaimedUnit) -> tuple[WorkUnit, Video] | None:
    """The unit and video rows, locked, if this worker still holds the lease; else None (the write is refused)."""
    row = s.scalar(select(WorkUnit).where(WorkUnit.id == unit.unit_id).with_for_update())
    if row is None or row.lease_token != unit.token or row.status != Status.RUNNING:
        return None
    return row, s.get(Video, row.video_id, with_for_update=True)


def renew(factory: Factory, units: tuple[ClaimedUnit, ...], lease_s: float) -> set[int]:
    """Extend the leases this worker still holds; returns the ids of those units (a missing id was taken over)."""
    held = set()
    with factory.begin() as s:
        expires = utcnow() + timedelta(seconds=lease_s)
        for unit in units:
            rows = _fenced(s, unit)
            if rows is not None:
                rows[0].lease_expires_at = expires
                held.add(unit.unit_id)
    return held


def reap_expired(factory: Factory, *, max_attempts: int) -> int:
    """Return units whose lease expired (a killed, frozen or partitioned worker) to pending; returns how many.

    The claim that expired counted as an attempt: a unit that has used `max_attempts` is failed instead, so a video
    that kills its worker every time cannot loop forever.
    """
    requeued = 0
    with factory.begin() as s:
        expired = list(s.scalars(select(WorkUnit).where(WorkUnit.status == Status.RUNNING,
                                                        WorkUnit.lease_expires_at < utcnow())
                                 .with_for_update(skip_locked=True)))
        for unit in expired:
            video = s.get(Video, unit.video_id)
            error = f"lease expired: worker {unit.lease_owner} stopped renewing it (attempt {unit.attempts})"
            requeued += _retry_or_fail(s, unit, video, error, max_attempts=max_attempts, not_before=None)
    return requeued


def _retry_or_fail(s: Session, unit: WorkUnit, video: Video, error: str, *, max_attempts: int,
                   not_before: datetime | None, solo: bool = False) -> bool:
    """Back to pending (True), or failed after the last attempt, or cancelled if its run was cancelled."""
    unit.last_error = video.last_error = error[:4000]
    if s.get(Run, video.run_id).cancelled_at is not None:
        move(unit, video, Status.CANCELLED)
        return False
    if unit.attempts >= max_attempts:
        video.last_error = f"failed after {unit.attempts} attempts: {error}"[:4000]
        move(unit, video, Status.FAILED)
        return False
    move(unit, video, Status.PENDING)
    unit.not_before = not_before
    unit.solo = unit.solo or solo
    return True


def record_retry(factory: Factory, unit: ClaimedUnit, error: str, *, max_attempts: int, backoff_s: float,
                 solo: bool = False, spent_s: float = 0.0, rate: Rate | None = None,
                 session_id: int | None = None) -> bool | None:
    """A failed attempt: retry after `backoff_s` (True) or, past `max_attempts`, fail (False). None: lease lost.

    The `spent_s` seconds the attempt used are charged to the video that needed them (a "retry" cost record), so
    retries show in its cost and in the run's total, and success-only denominators carry them."""
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return None
        if spent_s > 0 and rate is not None:
            s.add(charge(rows[1].id, "retry", spent_s, rate, session_id))
        return _retry_or_fail(s, *rows, error, max_attempts=max_attempts,
                              not_before=utcnow() + timedelta(seconds=backoff_s), solo=solo)


def release(factory: Factory, unit: ClaimedUnit) -> bool:
    """Give a unit back without charging an attempt (shutdown, or its batch stopped for another's cancel).

    Units of a cancelled run become cancelled. False if the lease was already lost.
    """
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        row.attempts -= 1
        video.attempts -= 1
        cancelled = s.get(Run, video.run_id).cancelled_at is not None
        move(row, video, Status.CANCELLED if cancelled else Status.PENDING)
        return True


def cancelled_runs(factory: Factory, run_ids: set[int]) -> set[int]:
    with factory() as s:
        return set(s.scalars(select(Run.id).where(Run.id.in_(run_ids), Run.cancelled_at.is_not(None))))


def mark_uploading(factory: Factory, unit: ClaimedUnit, sha256: str) -> bool:
    """Record, before the upload, the checksum about to be stored at the video's key.

    If this worker dies after the upload but before record_success, the next attempt finds an object with exactly
    this checksum at the key and adopts it, instead of rendering again and failing on a conflict with itself.
    """
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return False
        rows[1].upload_sha256 = sha256
        return True


@dataclass(frozen=True)
class VideoOutput:
    uri: str
    bytes: int
    sha256: str
    render_s: float
    encode_s: float
    upload_s: float
    stages: dict[str, float] = field(default_factory=dict)  # the render's text/denoise/decode share
    seam_score: float | None = None  # a long video's (engine.chunks.seam_score)
    needs_review: bool = False
    # The worker seconds to charge: the render share plus the storing seconds no render covered (jobs.cost.ledger).
    # None: all of render, encode and upload (nothing overlapped).
    charged: float | None = None

    @property
    def charged_s(self) -> float:
        return self.render_s + self.encode_s + self.upload_s if self.charged is None else self.charged


@dataclass(frozen=True)
class StoragePrice:
    """Keeping a stored video (per GB-month, for a number of months) and serving it once (per GB; 0: not charged)."""

    gb_month_usd: float
    months: float
    egress_gb_usd: float
    source: str

    def records(self, video_id: int, size: int) -> list[CostRecord]:
        gb = size / 1e9
        out = [CostRecord(video_id=video_id, kind="storage", seconds=0.0, rate_usd_per_hour=0.0,
                          rate_source=f"${self.gb_month_usd:g}/GB-month x {self.months:g} months ({self.source})",
                          amount_micro_usd=round(gb * self.gb_month_usd * self.months * 1e6))]
        if self.egress_gb_usd > 0:
            out.append(CostRecord(video_id=video_id, kind="egress", seconds=0.0, rate_usd_per_hour=0.0,
                                  rate_source=f"${self.egress_gb_usd:g}/GB served once ({self.source})",
                                  amount_micro_usd=round(gb * self.egress_gb_usd * 1e6)))
        return out


def record_success(factory: Factory, unit: ClaimedUnit, out: VideoOutput, rate: Rate,
                   storage: StoragePrice | None = None, session_id: int | None = None) -> bool:
    """Mark one video succeeded with its output and its cost records: "gpu" for this unit's render share plus its
    storing seconds no render covered (`out.charged_s`; a long video's earlier chunks were charged as they finished),
    storage and egress by its size. False if the lease was lost."""
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        move(row, video, Status.SUCCEEDED)
        video.uri, video.bytes, video.sha256 = out.uri, out.bytes, out.sha256
        # A long video's earlier chunks left their seconds on the row (record_chunk): the last one adds its own.
        earlier = row.chunk > 0
        video.render_s = ((video.render_s or 0.0) if earlier else 0.0) + out.render_s
        for stage in ("text", "denoise", "decode"):
            before = getattr(video, f"{stage}_s") if earlier else None
            mine = out.stages.get(stage)
            setattr(video, f"{stage}_s", mine if before is None else before + (mine or 0.0))
        video.encode_s, video.upload_s = out.encode_s, out.upload_s
        video.seam_score, video.needs_review = out.seam_score, out.needs_review
        video.last_error = row.last_error = None
        s.add(charge(video.id, "gpu", out.charged_s, rate, session_id))
        if storage is not None:
            s.add_all(storage.records(video.id, out.bytes))
        return True


def record_charge(factory: Factory, video_id: int, kind: str, seconds: float, rate: Rate,
                  session_id: int | None) -> None:
    """A charge outside any fenced write: seconds spent on a video whose attempt is not recorded (its run was
    cancelled mid-render, so its units were released)."""
    if seconds > 0:
        with factory.begin() as s:
            s.add(charge(video_id, kind, seconds, rate, session_id))


def record_chunk(factory: Factory, unit: ClaimedUnit, checkpoint: str, render_s: float,
                 stages: dict[str, float], charged_s: float, rate: Rate, session_id: int | None = None) -> bool:
    """A long video's chunk (not its last) finished: its latents are at `checkpoint`; its seconds go on the video's
    row and `charged_s` is charged now, to this worker's session; the video waits (pending) for its next chunk,
    which becomes claimable. False if the lease was lost."""
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        transition(row, Status.SUCCEEDED)
        transition(video, Status.PENDING)
        row.lease_owner, row.lease_expires_at, row.checkpoint = None, None, checkpoint
        row.last_error = video.last_error = None
        video.render_s = (video.render_s or 0.0) + render_s
        for stage in ("text", "denoise", "decode"):
            setattr(video, f"{stage}_s", (getattr(video, f"{stage}_s") or 0.0) + stages.get(stage, 0.0))
        following = s.scalar(select(WorkUnit).where(WorkUnit.video_id == video.id, WorkUnit.chunk == row.chunk + 1)
                             .with_for_update())
        following.ready = True
        s.add(charge(video.id, "gpu", charged_s, rate, session_id))
        return True


def checkpoints(factory: Factory, video_id: int, before: int) -> list[str | None]:
    """The checkpoints of a long video's chunks 0 .. before-1, in order (None where a chunk has none)."""
    with factory() as s:
        found = dict(s.execute(select(WorkUnit.chunk, WorkUnit.checkpoint)
                               .where(WorkUnit.video_id == video_id, WorkUnit.chunk < before)).all())
    return [found.get(k) for k in range(before)]


def chunk_tokens(factory: Factory, video_id: int) -> dict[int, int]:
    """Each chunk of a long video and the last lease token it was claimed with (its attempts' checkpoint keys)."""
    with factory() as s:
        return dict(s.execute(select(WorkUnit.chunk, WorkUnit.lease_token).where(WorkUnit.video_id == video_id)).all())


def record_failure(factory: Factory, unit: ClaimedUnit, error: str, spent_s: float = 0.0, rate: Rate | None = None,
                   session_id: int | None = None) -> bool:
    """Fail one video for good (retrying cannot help, e.g. a different object at its key), charging the `spent_s`
    seconds of its attempt. False if lease lost."""
    with factory.begin() as s:
        rows = _fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        if spent_s > 0 and rate is not None:
            s.add(charge(video.id, "retry", spent_s, rate, session_id))
        row.last_error = video.last_error = error[:4000]
        move(row, video, Status.FAILED)
        return True


def claimable_count(factory: Factory) -> int:
    """How many units a worker could claim now."""
    now = utcnow()
    with factory() as s:
        return s.scalar(select(func.count()).select_from(WorkUnit).where(
            WorkUnit.status == Status.PENDING, WorkUnit.ready.is_(True),
            or_(WorkUnit.not_before.is_(None), WorkUnit.not_before <= now)))


def claimable(factory: Factory) -> bool:
    """Is any unit waiting that a worker could claim now?"""
    now = utcnow()
    with factory() as s:
        return s.scalar(select(WorkUnit.id).where(
            WorkUnit.status == Status.PENDING, WorkUnit.ready.is_(True),
            or_(WorkUnit.not_before.is_(None), WorkUnit.not_before <= now)).limit(1)) is not None
