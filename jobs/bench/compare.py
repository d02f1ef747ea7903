"""`reelbatch bench`: the script a user would write from the diffusers docs, and reelbatch's worker path, side by side.

Both sides run in one process, on the same model folder, prompts, seeds and shape:

- baseline: load WanPipeline once; then for each prompt call the pipeline with its defaults, encode the MP4 and put it
  in a store, one video after another. Its stages are timed by wrapping `encode_prompt` and `vae.decode`; the
  denoising is the rest of the pipeline call.
- engine: a manifest submitted to a fresh SQLite database and rendered by `jobs.render.batch.render_next_batch`, the
  function a Celery worker runs (claims, same-shape batches, text cache, batched guidance, encode, store, rows).
  Its stages come from the rows it wrote.

Each side renders one untimed warm-up video first (thread pools, allocator, first-call costs), then the timed set.
Both MP4 sets are decoded and compared frame by frame. The denoiser's FLOPs are counted with
torch.utils.flop_counter on one transformer call, and the machine's peak is a large matmul measured in the same run
and dtype, so MFU needs no published figure.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

from engine.bench_models import ensure_bench_model
from engine.engine import Engine
from engine.families import read_folder
from engine.metrics import psnr_frames
from engine.models import ModelDefaults, ModelInfo, Registry, builtin_models
from engine.tiny import ensure_tiny
from jobs.bench.baseline import denoise_gflop, load_baseline, measure_peak_gflops, run_baseline
from jobs.bench.presets import Preset, prompts
from jobs.bench.side import Side
from jobs.db import queries
from jobs.db.connect import session_factory, upgrade
from jobs.db.rows import Video
from jobs.manifest import load_manifest
from jobs.render.batch import render_next_batch, warm_up
from jobs.render.finisher import Finisher
from jobs.settings import Settings
from storage.encode import decode_frames
from storage.stores import open_store


@dataclass
class BenchResult:
    preset: str
    why: str
    device: str
    dtype: str
    shape: dict
    baseline: Side
    engine: Side
    min_psnr_db: float
    psnr_db: list[float]  # per video: its worst frame, raw frames before encoding
    min_psnr_mp4_db: float  # the same after both sides' MP4s are decoded
    denoise_gflop: float  # per video
    peak_gflops: float

    @property
    def baseline_denoise_mfu(self) -> float:
        """The baseline's denoising FLOPs over its denoising seconds, as a share of the measured matmul peak."""
        return self.denoise_gflop * self.baseline.videos / self.baseline.stages["denoise"] / self.peak_gflops

    @property
    def denoise_mfu(self) -> float:
        return self.denoise_gflop * self.engine.videos / self.engine.stages["denoise"] / self.peak_gflops

    @property
    def speedup(self) -> float:
        return self.engine.videos_per_hour / self.baseline.videos_per_hour

    @property
    def denoise_floor_s(self) -> float:
        """The least denoising time per video this machine allows: its FLOPs at the measured matmul peak."""
        return self.denoise_gflop / self.peak_gflops

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("baseline", "engine")}
        return {**d, "baseline_denoise_mfu": self.baseline_denoise_mfu, "denoise_mfu": self.denoise_mfu,
                "baseline": self.baseline.to_dict(), "engine": self.engine.to_dict(), "speedup": self.speedup,
                "denoise_floor_s": self.denoise_floor_s}


# ---- reelbatch: the worker path -----------------------------------------------------------------------------------


def run_engine(info: ModelInfo, preset: Preset, cases: list[tuple[str, int]], work: Path, settings: Settings,
               on_video: Callable[[], None] | None = None) -> tuple[Side, dict[int, tuple[np.ndarray, bytes]]]:
    registry = Registry({info.name: info})
    engine = Engine(settings.engine_config(), registry)
    upgrade(settings.database_url)
    factory = session_factory(settings.database_url)
    spec = load_manifest(write_manifest(work / "bench.yaml", "bench", info, preset, cases, settings.output),
                         registry=registry)
    submitted = queries.submit_run(factory, spec, output=settings.output)
    # Warm-up, untimed as the baseline's: what a worker does at start (jobs.render.batch.warm_up), one step of a batch of
    # the size it will claim for each waiting shape, so compiled code and kernels are ready for the timed batches.
    warm_up(settings, engine, factory)
    side = Side("engine", config={"path": "jobs.render.batch.render_next_batch (the Celery task's function)",
                                  "max_batch": settings.max_batch, "overlap": settings.overlap, **asdict(settings.engine_config())})
    side.config["cache_dir"] = str(side.config["cache_dir"])
    # Observe the frames the engine hands to the encoder (by database video id), to compare them before encoding.
    frames: dict[int, np.ndarray] = {}
    render = engine.render

    def observed(batch, should_stop=None):
        rendered = render(batch, should_stop)
        frames.update((v.request.video_id, v.frames) for v in rendered)
        return rendered

    engine.render = observed
    finisher = Finisher() if settings.overlap else None
    started = time.perf_counter()
    while True:
        result = render_next_batch(settings, engine, factory, finisher)
        for _ in range(result.succeeded + result.pending):
            if on_video:
                on_video()
        if not result.claimed:
            break
    if finisher:
        finisher.wait()
    side.wall_s = time.perf_counter() - started
    with factory() as s:
        rows = s.query(Video).filter(Video.run_id == submitted.run_id).order_by(Video.line).all()
        failed = [r.key for r in rows if r.status.value != "succeeded"]
        if failed:
            raise RuntimeError(f"bench videos did not succeed: {failed}: {rows[0].last_error}")
        side.videos = len(rows)
        side.stages = {
            "text": sum(r.text_s for r in rows), "denoise": sum(r.denoise_s for r in rows),
            "decode": sum(r.decode_s for r in rows), "encode": sum(r.encode_s for r in rows),
            "upload": sum(r.upload_s for r in rows),
        }
        store = open_store(settings.output)
        videos = {int(r.key[1:]): (frames[r.id], store.get(f"bench/{r.key}.mp4")) for r in rows}
    side.stages["other"] = max(0.0, side.wall_s - sum(side.stages.values()))
    return side, videos


def write_manifest(path: Path, name: str, info: ModelInfo, preset: Preset, cases: list[tuple[str, int]],
                   output: str) -> Path:
    """A manifest of `cases` (prompt, seed) at the preset's shape, as a user would write it."""
    path.write_text(yaml.safe_dump({
        "name": name, "model": info.name, "output": output,
        "defaults": {"resolution": f"{preset.width}x{preset.height}", "fps": preset.fps,
                     "duration_s": preset.frames / preset.fps, "steps": preset.steps, "guidance": preset.guidance},
        "videos": [{"id": f"v{i}", "prompt": p, "seed": s} for i, (p, s) in enumerate(cases)],
    }, sort_keys=False))
    return path


# ---- both -------------------------------------------------------------------------------------------------------


def bench_model(preset: Preset, cache_dir: Path) -> ModelInfo:
    """A built-in model as registered (tiny built into the cache on first use), or a bench model built likewise."""
    builtin = builtin_models()
    if preset.model in builtin:
        info = builtin[preset.model]
        return dataclasses.replace(info, path=ensure_tiny(cache_dir), builtin=False) if info.builtin else info
    path = ensure_bench_model(cache_dir, preset.model)
    # The folder says its family, as for a registered one (engine.families): Wan 2.2's switch and size grid.
    facts = read_folder(path, f"bench model {preset.model}")
    return ModelInfo(
        name=preset.model,
        defaults=ModelDefaults(preset.width, preset.height, preset.fps, preset.frames / preset.fps, preset.steps,
                               preset.guidance),
        path=path,
        temporal_factor=preset.temporal_factor,
        spatial_multiple=facts.spatial_multiple,
        max_frames=max(81, preset.frames),
        max_sequence_length=preset.max_sequence_length,
        family=facts.family,
        boundary_ratio=facts.boundary_ratio,
        guidance_2=preset.guidance_2,
    )


def run_bench(preset: Preset, settings: Settings, *, videos: int | None = None,
              on_video: Callable[[], None] | None = None) -> BenchResult:
    config = settings.engine_config()
    device, dtype = config.torch_device(), config.torch_dtype()
    info = bench_model(preset, settings.cache_dir)
    cases = [(p, 1000 + i) for i, p in enumerate(prompts(videos or preset.videos, preset.model))]
    with tempfile.TemporaryDirectory(prefix="reelbatch-bench-") as tmp:
        work = Path(tmp)
        peak = measure_peak_gflops(device, dtype)
        pipe = load_baseline(info.path, device, dtype)
        gflop = denoise_gflop(pipe, preset, device)  # before the timer wraps the pipeline's stages
        baseline, base_videos = run_baseline(pipe, preset, cases, work / "baseline", device, dtype, on_video)
        del pipe
        engine_settings = _engine_settings(settings, work, preset)
        engine, engine_videos = run_engine(info, preset, cases, work, engine_settings, on_video)
    # Per video, its worst frame: the raw frames each side encoded, and the MP4s as a viewer decodes them (x264
    # amplifies a one-step difference in a few pixels into a different macroblock decision, so this is lower).
    psnr_db = [float(psnr_frames(base_videos[i][0], engine_videos[i][0]).min()) for i in range(len(cases))]
    psnr_mp4_db = [float(psnr_frames(decode_frames(base_videos[i][1]), decode_frames(engine_videos[i][1])).min())
                   for i in range(len(cases))]
    n = len(cases)
    return BenchResult(
        preset=preset.name, why=preset.why, device=str(device), dtype=str(dtype),
        shape={"width": preset.width, "height": preset.height, "frames": preset.frames, "steps": preset.steps,
               "guidance": preset.guidance, "guidance_2": preset.guidance_2, "videos": n},
        baseline=baseline, engine=engine, min_psnr_db=min(psnr_db), psnr_db=psnr_db,
        min_psnr_mp4_db=min(psnr_mp4_db), denoise_gflop=gflop, peak_gflops=peak,
    )


def _engine_settings(settings: Settings, work: Path, preset: Preset) -> Settings:
    """The operator's engine switches, on a throwaway database, store and cache (so the text cache starts cold)."""
    from dataclasses import replace

    return replace(
        settings,
        database_url=f"sqlite:///{work / 'bench.db'}",
        output=f"file://{(work / 'engine').absolute()}/",
        cache_dir=settings.cache_dir if not settings.text_cache else _cold_cache(settings.cache_dir, work),
        max_batch=preset.batch,
    )


def _cold_cache(cache_dir: Path, work: Path) -> Path:
    """A cache folder with the built models (linked) but no text embeddings, so the engine starts cold."""
    cold = work / "cache"
    (cold / "models").mkdir(parents=True)
    built = Path(cache_dir) / "models"
    for model in built.iterdir() if built.is_dir() else ():  # none yet in a fresh cache
        (cold / "models" / model.name).symlink_to(model)
    return cold
