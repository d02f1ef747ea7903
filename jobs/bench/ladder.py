"""`reelbatch bench ladder`: a load test of the worker path, level by level (batch size x worker processes).

Each level is a fresh SQLite run of one shape, rendered by real worker processes: each loads the model, renders one
untimed warm-up batch, waits for the others, then runs `jobs.render.batch.render_next_batch` (the Celery task's
function, with its finisher) until nothing is left to claim. So every timed video is rendered warm, by workers that
compete for claims as deployed ones do. A level holds at least LEVEL_BATCHES batches per worker and LEVEL_MIN_VIDEOS
videos, so most of its time is steady state.

Per level: throughput (succeeded videos per hour of the level's wall time: first claim to last stored object),
P50/P95/P99 of each video's claim-to-stored seconds (from its row), the largest peak memory of a worker process (RSS,
and the device's peak allocation on a GPU), and the failure rate (failed over all videos; retries are counted too).
The capacity plan reads its steady state from these levels.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import resource
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.engine import Engine
from engine.models.registry import ModelInfo, Registry
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.bench.compare import write_manifest
from jobs.bench.presets import Preset, prompts
from jobs.bench.sides import bench_model
from jobs.db import submission
from jobs.db.connect import session_factory, upgrade
from jobs.db.rows import Video
from jobs.manifest import load_manifest
from jobs.render.batch import render_next_batch
from jobs.render.finisher import Finisher
from jobs.reports.stats import per_hour, percentiles, span_s
from jobs.settings import Settings

BATCHES = (1, 2, 4, 8, 16)
WORKERS = (1, 2)
LEVEL_BATCHES = 3  # batches per worker in each level, after its warm-up batch; more when a level is short
LEVEL_MIN_VIDEOS = 16


def level_videos(batch: int, workers: int) -> int:
    """Videos in a level: whole batches for every worker, at least LEVEL_BATCHES each and LEVEL_MIN_VIDEOS in all."""
    per_round = batch * workers
    return per_round * max(LEVEL_BATCHES, math.ceil(LEVEL_MIN_VIDEOS / per_round))


@dataclass
class Level:
    workers: int
    batch: int
    videos: int
    succeeded: int
    failed: int
    retries: int
    wall_s: float
    videos_per_hour: float
    latency_s: dict[str, float]  # claim to stored object, per succeeded video: p50, p95, p99, max
    peak_rss_mb: float  # the largest worker process's
    peak_device_mb: float | None  # on a GPU: the largest torch.cuda.max_memory_allocated of a worker

    @property
    def failure_rate(self) -> float:
        return self.failed / self.videos if self.videos else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "failure_rate": self.failure_rate}


@dataclass
class Ladder:
    preset: str
    device: str
    shape: dict
    levels: list[Level]

    def steady(self) -> Level:
        """The level with the most successful videos per hour: the capacity plan's ceiling."""
        return max(self.levels, key=lambda level: level.videos_per_hour)

    def to_dict(self) -> dict:
        best = self.steady()
        return {"preset": self.preset, "device": self.device, "shape": self.shape,
                "levels": [level.to_dict() for level in self.levels],
                "steady": {"workers": best.workers, "batch": best.batch, "videos_per_hour": best.videos_per_hour}}


def run_ladder(preset: Preset, settings: Settings, *, batches: tuple[int, ...] = BATCHES,
               workers: tuple[int, ...] = WORKERS,
               on_level: Callable[[int, int], None] | None = None) -> Ladder:
    info = bench_model(preset, settings.engine.cache_dir)
    shape = Shape(info.name, preset.width, preset.height, preset.frames, preset.steps, preset.guidance)
    levels = []
    for w in workers:
        for b in batches:
            if on_level:
                on_level(w, b)
            levels.append(_level(preset, info, shape, settings, w, b))
    return Ladder(preset.name, str(settings.engine_config().torch_device()),
                  {"width": shape.width, "height": shape.height, "frames": shape.frames, "steps": shape.steps,
                   "guidance": shape.guidance}, levels)


def _level(preset: Preset, info: ModelInfo, shape: Shape, settings: Settings, workers: int, batch: int) -> Level:
    count = level_videos(batch, workers)
    with tempfile.TemporaryDirectory(prefix="reelbatch-ladder-") as tmp:
        work = Path(tmp)
        (work / "cache").mkdir()
        (work / "cache" / "models").symlink_to(Path(settings.engine.cache_dir).resolve() / "models")
        level_settings = settings.with_values({
            "database_url": f"sqlite:///{work / 'ladder.db'}",
            "manifest.default_output": f"file://{(work / 'out').absolute()}/",
            "engine.cache_dir": work / "cache", "worker.max_batch": batch})
        upgrade(level_settings.database_url)
        factory = session_factory(level_settings.database_url)
        cases = [(p, 5000 + i) for i, p in enumerate(prompts(count, preset.model))]
        registry = Registry({info.name: info})
        spec = load_manifest(write_manifest(work / "ladder.yaml", "ladder", info, preset, cases,
                                            level_settings.manifest.default_output), registry=registry)
        run = submission.submit_run(factory, spec, output=level_settings.manifest.default_output)
        context = multiprocessing.get_context("spawn")
        ready = context.Barrier(workers)
        results = context.Queue()
        threads = max(1, (os.cpu_count() or 1) // workers)
        procs = [context.Process(target=_worker, args=(level_settings, info, shape, ready, results, threads),
                                 daemon=True) for _ in range(workers)]
        for proc in procs:
            proc.start()
        peaks = [results.get(timeout=3600) for _ in procs]
        for proc in procs:
            proc.join(60)
        errors = [p[2] for p in peaks if p[2]]
        if errors:
            raise RuntimeError(f"a ladder worker ({workers} x batch {batch}) failed:\n{errors[0]}")
        with factory() as s:
            rows = s.query(Video).filter(Video.run_id == run.run_id).all()
    done = [r for r in rows if r.status.value == "succeeded"]
    failed = sum(r.status.value == "failed" for r in rows)
    latencies = [(r.finished_at - r.started_at).total_seconds() for r in done]
    wall = span_s((r.started_at for r in done), (r.finished_at for r in done))
    device = [p[1] for p in peaks if p[1] is not None]
    return Level(
        workers=workers, batch=batch, videos=len(rows), succeeded=len(done), failed=failed,
        retries=sum(max(0, r.attempts - 1) for r in rows), wall_s=wall,
        videos_per_hour=per_hour(len(done), wall) or 0.0,
        latency_s=percentiles(latencies) or dict.fromkeys(("p50", "p95", "p99", "max"), 0.0),
        peak_rss_mb=max(p[0] for p in peaks), peak_device_mb=max(device) if device else None,
    )


def _worker(settings: Settings, info: ModelInfo, shape: Shape, ready, results, threads: int) -> None:
    """One worker process of a level: warm up, wait for the others, render until nothing is claimable."""
    torch.set_num_threads(threads)
    peak_device, error = None, None
    try:
        engine = Engine(settings.engine_config(), Registry({info.name: info}))
        warm = tuple(RenderRequest(-1 - i, f"warm-up {i}", None, 10**6 + i) for i in range(settings.worker.max_batch))
        engine.render(RenderBatch(shape, warm))
        ready.wait(600)
        factory = session_factory(settings.database_url)
        finisher = Finisher() if settings.worker.overlap else None
        while render_next_batch(settings, engine, factory, finisher).claimed:
            pass
        if finisher:
            finisher.wait()
        if torch.cuda.is_available():
            peak_device = torch.cuda.max_memory_allocated() / 2**20
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the level with it
        error = traceback.format_exc()
        ready.abort()
    finally:
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        results.put((peak_rss, peak_device, error))
        time.sleep(0.1)  # let the queue's feeder thread flush before the process exits
