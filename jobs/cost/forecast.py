"""`reelbatch estimate`: what a checked manifest will cost and when it will be done, per shape and in total, before
anything is written.

Per shape (model, size, frames, steps, guidance; chunks for a long video): its videos, the basis of its GPU seconds
(jobs.cost.estimate), GPU seconds, and cost: GPU seconds at the GPU-hour rate workers charge, storage and egress of its
bytes at the prices they charge (jobs.cost.prices). A shape with no basis has no number, and then neither has the
total; the known part is given apart. Time to finish on N GPUs follows jobs.cost.projection's rule, with the work
already queued ahead of the new run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from jobs.cost.estimate import Basis, Estimator, VideoShape
from jobs.cost.prices import Rate, StoragePrice
from jobs.cost.projection import UTILISATION, Queued, ahead, finish_s
from jobs.db.submission import unit_rank
from jobs.manifest import RunSpec


@dataclass(frozen=True)
class ShapeEstimate:
    shape: VideoShape
    fps: int
    videos: int
    video_s: float  # seconds of video, all its videos together
    basis: Basis
    bytes_per_video_s: float | None
    bytes_source: str
    # Money in micro-dollars, as the ledger keeps it (exact sums); None when unknown.
    gpu_micro: int | None
    storage_micro: int | None
    egress_micro: int | None

    @property
    def gpu_seconds(self) -> float | None:
        return None if self.basis.seconds is None else self.basis.seconds * self.videos

    @property
    def cost_micro(self) -> int | None:
        """GPU, storage and egress; no number without a GPU basis. Unknown bytes add nothing (and are said)."""
        if self.gpu_micro is None:
            return None
        return self.gpu_micro + (self.storage_micro or 0) + (self.egress_micro or 0)

    def to_dict(self) -> dict:
        s = self.shape
        return {"model": s.model, "width": s.width, "height": s.height, "frames": s.frames, "fps": self.fps,
                "steps": s.steps, "guidance": s.guidance, "chunks": s.chunks, "videos": self.videos,
                "basis": self.basis.to_dict(), "gpu_seconds": self.gpu_seconds, "cost_usd": _usd(self.cost_micro),
                "cost": {"gpu_usd": _usd(self.gpu_micro), "storage_usd": _usd(self.storage_micro),
                         "egress_usd": _usd(self.egress_micro)},
                "bytes_per_video_s": self.bytes_per_video_s, "bytes_source": self.bytes_source}


def _usd(micro: int | None) -> float | None:
    return None if micro is None else micro / 1e6


def shapes(spec: RunSpec, est: Estimator, rate: Rate, storage: StoragePrice) -> list[ShapeEstimate]:
    """The manifest's videos grouped by shape (and fps, which their bytes depend on), in order of first appearance."""
    groups: dict[tuple[VideoShape, int], list] = {}
    for v in spec.videos:
        shape = VideoShape(spec.model, v.width, v.height, v.frames, v.steps, v.guidance, v.chunks, v.window)
        groups.setdefault((shape, v.fps), []).append(v)
    out = []
    for (shape, fps), videos in groups.items():
        basis = est.seconds(shape)
        per_s, source = est.bytes_per_video_s(shape, fps)
        video_s = sum(v.duration_s for v in videos)
        gpu = None if basis.seconds is None else rate.micro_usd(basis.seconds * len(videos))
        kept, served = storage.micro_usd(per_s * video_s) if per_s is not None else (None, None)
        out.append(ShapeEstimate(shape, fps, len(videos), video_s, basis, per_s, source, gpu, kept, served))
    return out


def estimate(spec: RunSpec, est: Estimator, *, rate: Rate, storage: StoragePrice, workers: int, workers_source: str,
             queue: list[Queued], now: datetime) -> dict:
    """The manifest's estimate as plain data (`estimate --json`)."""
    per_shape = shapes(spec, est, rate, storage)
    known = [e for e in per_shape if e.basis.seconds is not None]
    complete = len(known) == len(per_shape)
    gpu_s = sum(e.gpu_seconds for e in known)
    micro = {k: sum(getattr(e, f"{k}_micro") or 0 for e in known) for k in ("gpu", "storage", "egress")}
    cost_usd = sum(micro.values()) / 1e6
    # Storage and egress are known only from bytes already stored of a shape: where no shape has any, they are
    # unknown (None), not $0; where some have, the sum of those, and storage_unknown_videos says how many are left out.
    bytes_known = any(e.bytes_per_video_s is not None for e in known)
    cost = {f"{k}_usd": (m / 1e6 if k == "gpu" or bytes_known else None) for k, m in micro.items()}
    before = ahead(est, queue, unit_rank(spec.priority, now, spec.deadline))
    finish = finish_s(before.seconds + gpu_s, workers) if complete else None
    finishes_at = None if finish is None else now + timedelta(seconds=finish)
    return {
        "name": spec.name, "model": spec.model, "videos": len(spec.videos),
        "gpu_seconds": gpu_s if complete else None, "cost_usd": cost_usd if complete else None,
        "cost": cost if complete else None,
        "finish_s": finish, "finishes_at": finishes_at.isoformat() if finishes_at else None,
        "gpus": workers, "gpus_source": workers_source, "utilisation": UTILISATION,
        "queue_ahead_s": before.seconds, "queue_ahead_unknown_units": before.unknown_units,
        "known": {"videos": sum(e.videos for e in known), "gpu_seconds": gpu_s, "cost_usd": cost_usd},
        "unknown_videos": sum(e.videos for e in per_shape) - sum(e.videos for e in known),
        "storage_unknown_videos": sum(e.videos for e in per_shape if e.bytes_per_video_s is None),
        "max_cost_usd": spec.max_cost_usd,
        "within_budget": None if spec.max_cost_usd is None or not complete else cost_usd <= spec.max_cost_usd,
        "deadline": spec.deadline.isoformat() if spec.deadline else None,
        "meets_deadline": None if spec.deadline is None or finishes_at is None else finishes_at <= spec.deadline,
        "gpu_hour_usd": rate.usd_per_hour, "gpu_hour_source": rate.source,
        "shapes": [e.to_dict() for e in per_shape],
    }
