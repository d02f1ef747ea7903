"""`reelbatch bench parallel`: one video on one rank against the same video split across ranks by Ulysses and CFG
parallel (engine.parallel), side by side in one run: seconds a video, each rank's peak resident memory, the speedup
and the efficiency (speedup over ranks), and whether the frames are the same bytes.

Each side is a group of ranks started by engine.parallel.spawn (gloo on a CPU, nccl on GPUs), each rank on its share
of the machine's cores (so a 2-rank side on 2 cores is 1 core a rank against 2 for the one-rank side), loading the
model, rendering one video untimed, then the videos one at a time (batch 1: the latency a user waits for). A side's
frames are judged against one rank's at the same threads a rank (rendered apart where the one-rank side ran more)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import resource
import time
from dataclasses import dataclass

from engine.models.registry import ModelInfo
from jobs.bench.presets import Preset
from jobs.settings import Settings


@dataclass(frozen=True)
class Side:
    ulysses: int
    cfg: int
    ring: int
    threads: int  # torch's threads a rank
    seconds_per_video: float
    peak_rss_mb: list[float]  # per rank
    sha256: list[str]  # rank 0's frames, per video


@dataclass(frozen=True)
class ParallelBench:
    model: str
    shape: str
    videos: int
    batched_guidance: bool  # off when a side is CFG parallel: every side then runs the two passes as two calls
    sides: list[Side]
    # One rank's frames (per video) at each side's threads a rank: torch's thread count alone changes the float sums
    # (the 1.3B widths at 1 and 2 threads render other bytes), so a side is judged against one rank at its threads.
    references: dict[int, list[str]]

    def speedup(self, side: Side) -> float:
        return self.sides[0].seconds_per_video / side.seconds_per_video

    def to_dict(self) -> dict:
        return {"model": self.model, "shape": self.shape, "videos": self.videos,
                "batched_guidance": self.batched_guidance,
                "sides": [{**dataclasses.asdict(s), "ranks": s.ulysses * s.cfg * s.ring, "speedup": self.speedup(s),
                           "efficiency": self.speedup(s) / (s.ulysses * s.cfg * s.ring),
                           "identical": s.sha256 == self.references[s.threads]} for s in self.sides],
                "references": {str(t): sha for t, sha in self.references.items()}}


def run_parallel(settings: Settings, info: ModelInfo, preset: Preset, layouts: list[tuple[int, int, int]],
                 videos: int) -> ParallelBench:
    """`layouts`: (ulysses, cfg, ring) per side after the one-rank side."""
    from engine.parallel import spawn
    from engine.types import Shape

    shape = Shape(info.name, preset.width, preset.height, preset.frames, preset.steps, preset.guidance)
    cores = os.cpu_count() or 1
    base = settings.engine_config()
    backend = "nccl" if base.torch_device().type == "cuda" else "gloo"
    batched = base.batched_guidance and all(c == 1 for _, c, _ in layouts)
    sides, references = [], {}
    for u, c, r in [(1, 1, 1), *layouts]:
        n = u * c * r
        config = dataclasses.replace(base, ulysses=u, cfg_parallel=c, ring=r, batched_guidance=batched)
        found = spawn(_rank, (config, info, shape, videos, max(1, cores // n)), ranks=n, backend=backend)
        sides.append(Side(u, c, r, max(1, cores // n), found[0]["seconds"] / videos, [r["peak_rss_mb"] for r in found],
                          found[0]["sha256"]))
        references.setdefault(sides[0].threads, sides[0].sha256)
    one = dataclasses.replace(base, batched_guidance=batched)
    for threads in sorted({s.threads for s in sides} - set(references)):
        (found,) = spawn(_rank, (one, info, shape, videos, threads), ranks=1, backend=None)
        references[threads] = found["sha256"]
    return ParallelBench(info.name, shape.key(), videos, batched, sides, references)


def _rank(rank: int, config, info: ModelInfo, shape, videos: int, threads: int) -> dict:
    import torch

    from engine.engine import Engine
    from engine.models.registry import Registry
    from engine.types import RenderBatch, RenderRequest

    torch.set_num_threads(threads)
    if config.torch_device().type == "cuda":
        torch.cuda.set_device(rank)
        config = dataclasses.replace(config, device=f"cuda:{rank}")
    engine = Engine(config, Registry({info.name: info}), measuring=[info.name])  # Ring is gated: measured here
    engine.render(RenderBatch(shape, (RenderRequest(-1, "a warm-up", None, 0),)))  # loads and warms: untimed
    sha, started = [], time.perf_counter()
    for i in range(videos):
        (video,) = engine.render(RenderBatch(shape, (RenderRequest(i, f"video {i} of the bench", None, 100 + i),)))
        if video.error is not None:
            raise RuntimeError(f"video {i}: {video.error}")
        sha.append(hashlib.sha256(video.frames.tobytes()).hexdigest())
    if config.torch_device().type == "cuda":
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - started, "sha256": sha,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
