"""`reelbatch bench`: the script a user would write from the diffusers docs, and reelbatch's worker path, side by side.

Both sides run in one process, on the same prompts, seeds and shape:

- baseline: load WanPipeline once; then for each prompt call the pipeline with its defaults, encode the MP4 and put it
  in a store, one video after another. Its stages are timed by wrapping `encode_prompt`, `vae.decode` and the
  postprocess; the denoising is the rest of the pipeline call.
- engine: a manifest submitted to a fresh SQLite database and rendered by `jobs.render.batch.render_next_batch`, the
  function a Celery worker runs (claims, same-shape batches, text cache, batched guidance, encode, store, rows).
  Its stages come from the rows it wrote.

By default both render the preset's model at the preset's steps and guidance. A few-step registration changes the
engine's side only (`--model NAME`, or a preset's `engine_model`): it renders that registration at its own
registered steps and guidance, and the baseline renders its teacher (or the preset's model) at the teacher's: the
choice a user makes between the two. Frames then come from two models, so PSNR between the sides is reported, not
a measure of error.

Alike on both sides: one untimed warm-up video first (thread pools, allocator, first-call costs); the postprocess
and the uint8 conversion counted in "decode"; the engine claims at least two batches, so its overlap of storing
with rendering is exercised. Both MP4 sets are decoded and compared frame by frame. The denoiser's FLOPs are counted
with torch.utils.flop_counter on one transformer call, and the machine's peak is a large matmul measured in the same
run and dtype (jobs.bench.machine adds a datasheet peak on known GPUs, the commit and package versions).
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

from engine.engine import Engine
from engine.frames.metrics import psnr_frames
from engine.models.registry import ModelInfo, Registry
from jobs.bench import machine
from jobs.bench.baseline import denoise_gflop, load_baseline, measure_peak_gflops, run_baseline
from jobs.bench.presets import Preset, prompts
from jobs.bench.side import Side, SideModel
from jobs.bench.sides import check_gates, side_models
from jobs.db import submission
from jobs.db.connect import session_factory, upgrade
from jobs.db.rows import Video
from jobs.errors import UsageError
from jobs.manifest import load_manifest
from jobs.render.batch import render_next_batch
from jobs.render.finisher import Finisher
from jobs.render.serving import warm_up
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
    denoise_gflop: float  # per video, the engine's (its steps and passes)
    peak_gflops: float
    baseline_denoise_gflop: float | None = None  # per video, the baseline's; None: the engine's
    # The machine and code measured (jobs.bench.machine): commit, package versions, device name, datasheet peak.
    environment: dict = dataclasses.field(default_factory=dict)
    same_model: bool = True  # both sides rendered the same registration
    # Where the engine side's distilled gate stood: None (no teacher, or it passed), else why workers would refuse
    # it; only a --speed-only run renders such a registration.
    engine_gate: str | None = None

    @property
    def baseline_gflop(self) -> float:
        return self.denoise_gflop if self.baseline_denoise_gflop is None else self.baseline_denoise_gflop

    @property
    def baseline_denoise_mfu(self) -> float:
        """The baseline's denoising FLOPs over its denoising seconds, as a share of the measured matmul peak."""
        return self.baseline_gflop * self.baseline.videos / self.baseline.stages["denoise"] / self.peak_gflops

    @property
    def denoise_mfu(self) -> float:
        return self.denoise_gflop * self.engine.videos / self.engine.stages["denoise"] / self.peak_gflops

    def datasheet_mfu(self) -> dict[str, float | None]:
        """Both sides' denoise MFU against the GPU's datasheet peak (None where the device has none listed)."""
        peak = self.environment.get("datasheet_peak_gflops")
        if not peak:
            return {"baseline": None, "engine": None}
        return {side: mfu * self.peak_gflops / peak
                for side, mfu in (("baseline", self.baseline_denoise_mfu), ("engine", self.denoise_mfu))}

    @property
    def speedup(self) -> float:
        return self.engine.videos_per_hour / self.baseline.videos_per_hour

    @property
    def denoise_floor_s(self) -> float:
        """The least denoising time per video this machine allows: its FLOPs at the measured matmul peak."""
        return self.denoise_gflop / self.peak_gflops

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("baseline", "engine")}
        return {**d, "baseline_denoise_gflop": self.baseline_gflop, "baseline_denoise_mfu": self.baseline_denoise_mfu,
                "denoise_mfu": self.denoise_mfu, "datasheet_mfu": self.datasheet_mfu(),
                "baseline": self.baseline.to_dict(), "engine": self.engine.to_dict(), "speedup": self.speedup,
                "denoise_floor_s": self.denoise_floor_s}


# ---- reelbatch: the worker path -----------------------------------------------------------------------------------


def run_engine(side_model: SideModel, preset: Preset, cases: list[tuple[str, int]], work: Path,
               settings: Settings, on_video: Callable[[], None] | None = None, *, speed_only: bool = False
               ) -> tuple[Side, dict[int, tuple[np.ndarray, bytes]]]:
    """`speed_only`: render the registration whether or not its distilled gate passed (run_bench says which)."""
    info = side_model.info
    registry = Registry({info.name: info})
    engine = Engine(settings.engine_config(), registry, measuring=[info.name] if speed_only else ())
    upgrade(settings.database_url)
    factory = session_factory(settings.database_url)
    output = settings.manifest.default_output
    spec = load_manifest(write_manifest(work / "bench.yaml", "bench", info, preset, cases, output,
                                        steps=side_model.steps, guidance=side_model.guidance), registry=registry)
    submitted = submission.submit_run(factory, spec, output=output)
    # Warm-up, untimed as the baseline's: what a worker does at start (jobs.render.serving.warm_up), one step of a
    # batch of the size it will claim for each waiting shape, so compiled code and kernels are ready for the timed
    # batches.
    warm_up(settings, engine, factory)
    side = Side("engine", model=side_model.describe(),
                config={"path": "jobs.render.batch.render_next_batch (the Celery task's function)",
                        "max_batch": settings.worker.max_batch, "overlap": settings.worker.overlap,
                        **asdict(settings.engine_config())})
    side.config["cache_dir"] = str(side.config["cache_dir"])
    # Observe the frames the engine hands to the encoder (by database video id), to compare them before encoding.
    frames: dict[int, np.ndarray] = {}
    render = engine.render

    def observed(batch, should_stop=None):
        rendered = render(batch, should_stop)
        frames.update((v.request.video_id, v.frames) for v in rendered)
        return rendered

    engine.render = observed
    finisher = Finisher() if settings.worker.overlap else None
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
            # Every video's checks (jobs.render.checks): at most 2% of its render (docs/PERFORMANCE.md).
            "checks": sum(r.checks_s or 0.0 for r in rows),
        }
        store = open_store(settings.manifest.default_output)
        videos = {int(r.key[1:]): (frames[r.id], store.get(f"bench/{r.key}.mp4")) for r in rows}
    side.stages["other"] = max(0.0, side.wall_s - sum(side.stages.values()))
    return side, videos


def write_manifest(path: Path, name: str, info: ModelInfo, preset: Preset, cases: list[tuple[str, int]],
                   output: str, *, steps: int | None = None, guidance: float | None = None) -> Path:
    """A manifest of `cases` (prompt, seed) at the preset's shape (and steps and guidance, unless given), as a user
    would write it."""
    encoder = {} if preset.encoder_preset == "medium" else {"preset": preset.encoder_preset}  # as the baseline's
    path.write_text(yaml.safe_dump({
        "name": name, "model": info.name, "output": output, **encoder,
        "defaults": {"resolution": f"{preset.width}x{preset.height}", "fps": preset.fps,
                     "duration_s": preset.frames / preset.fps, "steps": steps or preset.steps,
                     "guidance": preset.guidance if guidance is None else guidance},
        "videos": [{"id": f"v{i}", "prompt": p, "seed": s} for i, (p, s) in enumerate(cases)],
    }, sort_keys=False))
    return path


# ---- both -------------------------------------------------------------------------------------------------------


def run_bench(preset: Preset, settings: Settings, *, videos: int | None = None, model: str | None = None,
              speed_only: bool = False, on_video: Callable[[], None] | None = None) -> BenchResult:
    """Both sides, timed. A distilled registration whose gate has not passed is refused, as a worker refuses it,
    unless `speed_only`: then it renders and the result's `engine_gate` says why workers would not."""
    config = settings.engine_config()
    device, dtype = config.torch_device(), config.torch_dtype()
    baseline_model, engine_model = side_models(preset, settings, model)
    same = baseline_model == engine_model
    try:
        check_gates(settings, engine_model.info)
        refused = None
    except UsageError as exc:
        if not speed_only or engine_model.info.teacher is None:
            raise
        if settings.engine_config().lossy():
            raise UsageError("--speed-only: times a distilled registration with the lossy accelerators off "
                             "(REELBATCH_STEP_CACHE, REELBATCH_GUIDANCE_FRACTION, REELBATCH_STEP_SCALE)") from None
        refused = str(exc)
    cases = [(p, 1000 + i) for i, p in enumerate(prompts(videos or preset.videos, preset.model))]
    with tempfile.TemporaryDirectory(prefix="reelbatch-bench-") as tmp:
        work = Path(tmp)
        peak = measure_peak_gflops(device, dtype)
        pipe = load_baseline(baseline_model.info.path, device, dtype)
        # Before the timer wraps the pipeline's stages. A registration of the same folder has the same transformer
        # (adapters are fused into its weights), so only the steps and passes differ.
        per_pass = denoise_gflop(pipe, preset, device, steps=1, guidance=1.0)
        if engine_model.info.path != baseline_model.info.path:
            per_pass_engine = denoise_gflop(load_baseline(engine_model.info.path, device, dtype), preset, device,
                                            steps=1, guidance=1.0)
        else:
            per_pass_engine = per_pass
        baseline, base_videos = run_baseline(pipe, preset, cases, work / "baseline", device, dtype, on_video,
                                             steps=baseline_model.steps, guidance=baseline_model.guidance)
        baseline.model = baseline_model.describe()
        del pipe
        engine_settings = _engine_settings(settings, work, preset, len(cases))
        engine, engine_videos = run_engine(engine_model, preset, cases, work, engine_settings, on_video,
                                           speed_only=refused is not None)
    # Per video, its worst frame: the raw frames each side encoded, and the MP4s as a viewer decodes them (x264
    # amplifies a one-step difference in a few pixels into a different macroblock decision, so this is lower).
    psnr_db = [float(psnr_frames(base_videos[i][0], engine_videos[i][0]).min()) for i in range(len(cases))]
    psnr_mp4_db = [float(psnr_frames(decode_frames(base_videos[i][1]), decode_frames(engine_videos[i][1])).min())
                   for i in range(len(cases))]
    n = len(cases)
    return BenchResult(
        preset=preset.name, why=preset.why, device=str(device), dtype=str(dtype),
        shape={"width": preset.width, "height": preset.height, "frames": preset.frames, "steps": engine_model.steps,
               "guidance": engine_model.guidance, "guidance_2": preset.guidance_2, "videos": n,
               "encoder_preset": preset.encoder_preset},
        baseline=baseline, engine=engine, min_psnr_db=min(psnr_db), psnr_db=psnr_db,
        min_psnr_mp4_db=min(psnr_mp4_db),
        denoise_gflop=per_pass_engine * engine_model.steps * engine_model.passes(), peak_gflops=peak,
        baseline_denoise_gflop=per_pass * baseline_model.steps * baseline_model.passes(),
        environment=machine.environment(device), same_model=same, engine_gate=refused,
    )


def _engine_settings(settings: Settings, work: Path, preset: Preset, videos: int) -> Settings:
    """The operator's engine switches, on a throwaway database, store and cache (so the text cache starts cold).
    Batches of the preset's size, but at least two of them, so that storing one overlaps rendering the next."""
    cache_dir = settings.engine.cache_dir
    return settings.with_values({
        "database_url": f"sqlite:///{work / 'bench.db'}",
        "manifest.default_output": f"file://{(work / 'engine').absolute()}/",
        "engine.cache_dir": _cold_cache(cache_dir, work) if settings.engine.text_cache else cache_dir,
        "worker.max_batch": max(1, min(preset.batch, videos // 2)),
    })


def _cold_cache(cache_dir: Path, work: Path) -> Path:
    """A cache folder with the built models and the recorded quality gates (linked) but no text embeddings, so the
    engine starts cold."""
    from engine.levers.gates import GATES_FILE

    cold = work / "cache"
    (cold / "models").mkdir(parents=True)
    built = Path(cache_dir) / "models"
    for model in built.iterdir() if built.is_dir() else ():  # none yet in a fresh cache
        (cold / "models" / model.name).symlink_to(model)
    if (Path(cache_dir) / GATES_FILE).is_file():
        (cold / GATES_FILE).symlink_to(Path(cache_dir) / GATES_FILE)
    return cold
