"""Recording a claimed unit's outcome: success with its output and cost records, a long video's finished chunk, a
retry, a failure, and the checksum written before an upload. Every write is fenced by the unit's lease token
(jobs.claims.leases.fenced): a worker whose lease was taken over writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.claims.claims import ClaimedUnit
from jobs.claims.leases import fenced, fenced_all, retry_or_fail
from jobs.cost.prices import Rate, StoragePrice, charge
from jobs.db.base import utcnow
from jobs.db.queries import Factory
from jobs.db.rows import Video, WorkUnit
from jobs.db.status import Status, move, transition
from jobs.render.checks import with_earlier

# The render's stages, each with its seconds on the video's row (`text_s`, ...): its share of its batches' stages.
RENDER_STAGES = ("text", "denoise", "decode")


@dataclass(frozen=True)
class VideoOutput:
    uri: str
    bytes: int
    sha256: str
    render_s: float
    encode_s: float
    upload_s: float
    stages: dict[str, float] = field(default_factory=dict)  # the render's text/denoise/decode share
    seam_score: float | None = None  # a long video's (engine.long.stitch.seam_score)
    needs_review: bool = False
    # The worker seconds to charge: the render share plus the storing seconds no render covered (jobs.cost.meter).
    # None: all of render, encode and upload (nothing overlapped).
    charged: float | None = None
    poster_uri: str | None = None  # None: no poster could be stored (jobs.render.posters)
    precision: str | None = None  # what it rendered at (engine.levers.precision), recorded on its "gpu" charge
    # Its checks (jobs.render.checks: JSON text, whether they flag it, their seconds); None: not checked (adopted).
    checks: str | None = None
    flagged: bool = False
    checks_s: float | None = None

    @property
    def charged_s(self) -> float:
        return self.render_s + self.encode_s + self.upload_s if self.charged is None else self.charged


def add_render(video: Video, render_s: float, stages: dict[str, float], *, after_earlier: bool) -> None:
    """Put a render's seconds on the video's row: replacing what is there, or, `after_earlier` (a long video's
    chunks), adding to what its earlier chunks left."""
    video.render_s = ((video.render_s or 0.0) if after_earlier else 0.0) + render_s
    for stage in RENDER_STAGES:
        before = getattr(video, f"{stage}_s") if after_earlier else None
        mine = stages.get(stage)
        setattr(video, f"{stage}_s", mine if before is None else before + (mine or 0.0))


def mark_all_uploading(factory: Factory, marks: list[tuple[ClaimedUnit, str]]) -> set[int]:
    """Record, before the uploads, the checksum each video is about to store at its key, for a batch's videos in one
    transaction, each fenced alone; the ids of the units whose lease is held (the others are left as they are).

    If this worker dies after an upload but before record_successes, the next attempt finds an object with exactly
    this checksum at the key and adopts it, instead of rendering again and failing on a conflict with itself.
    """
    if not marks:
        return set()
    with factory.begin() as s:
        held = fenced_all(s, [unit for unit, _ in marks])
        for unit, sha256 in marks:
            if unit.unit_id in held:
                held[unit.unit_id][1].upload_sha256 = sha256
        return set(held)


def record_success(factory: Factory, unit: ClaimedUnit, out: VideoOutput, rate: Rate,
                   storage: StoragePrice | None = None, session_id: int | None = None) -> bool:
    """Mark one video succeeded with its output and its cost records: "gpu" for this unit's render share plus its
    storing seconds no render covered (`out.charged_s`; a long video's earlier chunks were charged as they finished),
    storage and egress by its size. False if the lease was lost."""
    return record_successes(factory, [(unit, out)], rate, storage, session_id)[unit.unit_id]


def record_successes(factory: Factory, done: list[tuple[ClaimedUnit, VideoOutput]], rate: Rate,
                     storage: StoragePrice | None = None, session_id: int | None = None) -> dict[int, bool]:
    """record_success for several videos in one transaction, each fenced alone (a unit whose lease was lost is
    skipped, the others recorded): a batch's successes cost one commit, where one each made a batch of small previews
    wait on a disk flush per video (docs/PERFORMANCE.md, "Storing on several threads"), and their rows are fenced
    with two statements (jobs.claims.leases.fenced_all). Returns, by unit id, whether each was recorded."""
    if not done:
        return {}
    with factory.begin() as s:
        held = fenced_all(s, [unit for unit, _ in done])
        for unit, out in done:
            if unit.unit_id in held:
                _succeed(s, *held[unit.unit_id], out, rate, storage, session_id)
        return {unit.unit_id: unit.unit_id in held for unit, _ in done}


def _succeed(s: Session, row: WorkUnit, video: Video, out: VideoOutput, rate: Rate, storage: StoragePrice | None,
             session_id: int | None) -> None:
    move(row, video, Status.SUCCEEDED)
    video.uri, video.bytes, video.sha256, video.poster_uri = out.uri, out.bytes, out.sha256, out.poster_uri
    add_render(video, out.render_s, out.stages, after_earlier=row.chunk > 0)
    video.encode_s, video.upload_s = out.encode_s, out.upload_s
    video.seam_score, video.needs_review = out.seam_score, out.needs_review
    if out.checks is not None:  # an earlier attempt's, sent back by its checks, stay beside this one's
        video.checks, video.flagged, video.checks_s = with_earlier(video.checks, out.checks), out.flagged, out.checks_s
    video.last_error = row.last_error = None
    s.add(charge(video.id, "gpu", out.charged_s, rate, session_id, out.precision))
    if storage is not None:
        s.add_all(storage.records(video.id, out.bytes))


def record_chunk(factory: Factory, unit: ClaimedUnit, checkpoint: str, render_s: float,
                 stages: dict[str, float], charged_s: float, rate: Rate, session_id: int | None = None,
                 precision: str | None = None) -> bool:
    """A long video's chunk (not its last) finished: its latents are at `checkpoint`; its seconds go on the video's
    row and `charged_s` is charged now, to this worker's session; the video waits (pending) for its next chunk,
    which becomes claimable. False if the lease was lost."""
    with factory.begin() as s:
        rows = fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        transition(row, Status.SUCCEEDED)
        transition(video, Status.PENDING)
        row.lease_owner, row.lease_expires_at, row.checkpoint = None, None, checkpoint
        row.last_error = video.last_error = None
        add_render(video, render_s, stages, after_earlier=True)
        following = s.scalar(select(WorkUnit).where(WorkUnit.video_id == video.id, WorkUnit.chunk == row.chunk + 1)
                             .with_for_update())
        following.ready = True
        s.add(charge(video.id, "gpu", charged_s, rate, session_id, precision))
        return True


def record_retry(factory: Factory, unit: ClaimedUnit, error: str, *, max_attempts: int, backoff_s: float,
                 solo: bool = False, spent_s: float = 0.0, rate: Rate | None = None,
                 session_id: int | None = None) -> bool | None:
    """A failed attempt: retry after `backoff_s` (True) or, past `max_attempts`, fail (False). None: lease lost.

    The `spent_s` seconds the attempt used are charged to the video that needed them (a "retry" cost record), so
    retries show in its cost and in the run's total, and success-only denominators carry them."""
    with factory.begin() as s:
        rows = fenced(s, unit)
        if rows is None:
            return None
        if spent_s > 0 and rate is not None:
            s.add(charge(rows[1].id, "retry", spent_s, rate, session_id))
        return retry_or_fail(s, *rows, error, max_attempts=max_attempts,
                             not_before=utcnow() + timedelta(seconds=backoff_s), solo=solo)


def record_failure(factory: Factory, unit: ClaimedUnit, error: str, spent_s: float = 0.0, rate: Rate | None = None,
                   session_id: int | None = None) -> bool:
    """Fail one video for good (retrying cannot help, e.g. a different object at its key), charging the `spent_s`
    seconds of its attempt. False if lease lost."""
    with factory.begin() as s:
        rows = fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        if spent_s > 0 and rate is not None:
            s.add(charge(video.id, "retry", spent_s, rate, session_id))
        row.last_error = video.last_error = error[:4000]
        move(row, video, Status.FAILED)
        return True


def record_charge(factory: Factory, video_id: int, kind: str, seconds: float, rate: Rate,
                  session_id: int | None) -> None:
    """A charge outside any fenced write: seconds spent on a video whose attempt is not recorded (its render stopped
    mid-batch and its unit was released: its run was cancelled, or its worker shut down)."""
    if seconds > 0:
        with factory.begin() as s:
            s.add(charge(video_id, kind, seconds, rate, session_id))


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
