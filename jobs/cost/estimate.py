"""What one video of a shape will take in GPU seconds, and in bytes, with the basis each number stands on.

The basis, best first:
1. measured: the ledger's charged seconds per successful video of exactly this shape (model, size, frames, steps,
   guidance), over its RECENT most recently finished ones. Every charge of those videos counts (their renders,
   unoverlapped storing, the retries and lost attempts they needed), as the ledger charged them;
2. fit: a least-squares line of charged seconds per successful video on work (pixels x frames x steps x guidance
   passes; a long video's frames are its chunks' windows) over the ledger's history of that model, each shape
   weighted by its videos. With two or more shapes of different work it has an intercept (the per-video cost that
   does not grow with work: encoding, storing, the batch's fixed costs); with one, or when the line would give a
   negative intercept or slope, it goes through zero (time proportional to work);
3. profile: the model's bench profile (jobs.cost.profiles), scaled by work from the shape the bench rendered;
4. unknown: no number.

Bytes: bytes per video-second of the recently stored videos of this shape, else of this model at this size and fps;
else unknown. Estimates are of what the ledger charges; idle worker time (a fleet's, not a run's) is not in them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from jobs.cost.profiles import Profile
from jobs.db.rows import CostRecord, Run, Video, WorkUnit
from jobs.db.status import Status

RECENT = 200  # successful videos of a shape the measured basis averages over, newest first


def video_work(width: int, height: int, frames: int, steps: int, guidance: float, chunks: int = 1) -> int:
    """What render time scales with: pixels x frames per pass x passes x steps x guidance passes (two with
    classifier-free guidance, which diffusers runs when guidance > 1), as a batch's time limit scales
    (jobs.render.serving)."""
    return width * height * frames * chunks * steps * (2 if guidance > 1 else 1)


@dataclass(frozen=True)
class VideoShape:
    """What a video's cost depends on. `window`: frames per pass (the model's window for a long video)."""

    model: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    chunks: int = 1
    window: int = 0

    @property
    def work(self) -> int:
        return video_work(self.width, self.height, self.window or self.frames, self.steps, self.guidance, self.chunks)


class BasisKind(str, enum.Enum):
    MEASURED = "measured"
    FIT = "fit"
    PROFILE = "profile"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Basis:
    kind: BasisKind
    seconds: float | None  # GPU seconds per video; None when unknown
    detail: dict

    def to_dict(self) -> dict:
        return {"kind": self.kind.value, "gpu_seconds_per_video": self.seconds, **self.detail}


class Estimator:
    """Bases for shapes, from one session's view of the ledger (None: no ledger) and the bench profiles; each shape
    is looked up once."""

    def __init__(self, session: Session | None, profiles: dict[str, Profile]):
        self.s, self.profiles = session, profiles
        self._seconds: dict[VideoShape, Basis] = {}
        self._bytes: dict[tuple, tuple[float | None, str]] = {}

    def seconds(self, shape: VideoShape) -> Basis:
        if shape not in self._seconds:
            self._seconds[shape] = self._measured(shape) or self._fit(shape) or self._profile(shape) or Basis(
                BasisKind.UNKNOWN, None, {"reason": f"no successful video of model {shape.model} in the ledger and "
                                                    f"no bench profile of it (`reelbatch bench`)"})
        return self._seconds[shape]

    def bytes_per_video_s(self, shape: VideoShape, fps: int) -> tuple[float | None, str]:
        """Stored bytes per second of video, and where the figure comes from."""
        key = (shape, fps)
        if key not in self._bytes:
            self._bytes[key] = self._stored(shape, fps)
        return self._bytes[key]

    # ---- the bases ---------------------------------------------------------------------------------------------------

    def _exact(self, shape: VideoShape) -> tuple:
        return (Run.model == shape.model, Video.width == shape.width, Video.height == shape.height,
                Video.frames == shape.frames, Video.steps == shape.steps, Video.guidance == shape.guidance)

    def _recent(self, *where) -> object:
        return (select(Video.id).join(Run, Run.id == Video.run_id).where(Video.status == Status.SUCCEEDED, *where)
                .order_by(Video.finished_at.desc(), Video.id.desc()).limit(RECENT).subquery())

    def _measured(self, shape: VideoShape) -> Basis | None:
        if self.s is None:
            return None
        ids = select(self._recent(*self._exact(shape)).c.id)
        videos, runs = self.s.execute(select(func.count(), func.count(distinct(Video.run_id)))
                                      .where(Video.id.in_(ids))).one()
        if not videos:
            return None
        seconds = float(self.s.scalar(select(func.coalesce(func.sum(CostRecord.seconds), 0.0))
                                      .where(CostRecord.video_id.in_(ids))))
        return Basis(BasisKind.MEASURED, seconds / videos, {"videos": videos, "runs": runs})

    def _fit(self, shape: VideoShape) -> Basis | None:
        if self.s is None:
            return None
        per_video = (select(CostRecord.video_id, func.sum(CostRecord.seconds).label("seconds"))
                     .group_by(CostRecord.video_id).subquery())
        columns = (Video.width, Video.height, WorkUnit.frames, Video.steps, Video.guidance, Video.chunks)
        rows = self.s.execute(
            select(*columns, func.count(Video.id), func.sum(per_video.c.seconds))
            .join(Run, Run.id == Video.run_id).join(per_video, per_video.c.video_id == Video.id)
            .join(WorkUnit, (WorkUnit.video_id == Video.id) & (WorkUnit.chunk == 0))
            .where(Run.model == shape.model, Video.status == Status.SUCCEEDED).group_by(*columns)).all()
        points = [(video_work(w, h, f, st, g, c), n, float(total) / n) for w, h, f, st, g, c, n, total in rows]
        if not points:
            return None
        intercept, slope = fit_line(points)
        return Basis(BasisKind.FIT, intercept + slope * shape.work, {
            "shapes": len(points), "videos": sum(n for _, n, _ in points), "intercept_s": intercept,
            "seconds_per_work": slope, "work": shape.work})

    def _profile(self, shape: VideoShape) -> Basis | None:
        p = self.profiles.get(shape.model)
        if p is None:
            return None
        ratio = shape.work / video_work(p.width, p.height, p.frames, p.steps, p.guidance)
        return Basis(BasisKind.PROFILE, p.seconds_per_video * ratio, {
            "profile": {"width": p.width, "height": p.height, "frames": p.frames, "steps": p.steps,
                        "guidance": p.guidance, "seconds_per_video": p.seconds_per_video, "device": p.device,
                        "measured_at": p.measured_at, "source": p.source, "shipped": p.shipped},
            "work_ratio": ratio})

    def _stored(self, shape: VideoShape, fps: int) -> tuple[float | None, str]:
        if self.s is None:
            return None, "no ledger"
        tries = ((self._exact(shape), "stored videos of this shape"),
                 ((Run.model == shape.model, Video.width == shape.width, Video.height == shape.height,
                   Video.fps == fps), f"stored videos of {shape.model} at {shape.width}x{shape.height}, {fps} fps"))
        for where, source in tries:
            ids = select(self._recent(*where, Video.bytes.is_not(None)).c.id)
            size, seconds = self.s.execute(select(func.sum(Video.bytes), func.sum(Video.duration_s))
                                           .where(Video.id.in_(ids))).one()
            if seconds:
                return float(size) / float(seconds), source
        return None, "no stored video of this model at this size and fps"


def fit_line(points: list[tuple[float, int, float]]) -> tuple[float, float]:
    """Weighted least squares of y on x over (x, weight, y) points: (intercept, slope). Through zero when the x are
    all one value, or the line would have a negative intercept or a slope of zero or less."""
    total = sum(n for _, n, _ in points)
    mean_x = sum(n * x for x, n, _ in points) / total
    mean_y = sum(n * y for _, n, y in points) / total
    sxx = sum(n * (x - mean_x) ** 2 for x, n, _ in points)
    if sxx > 0:
        slope = sum(n * (x - mean_x) * (y - mean_y) for x, n, y in points) / sxx
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            return intercept, slope
    return 0.0, sum(n * x * y for x, n, y in points) / sum(n * x * x for x, n, _ in points)
