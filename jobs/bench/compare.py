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
import hashlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from engine.engine import Engine
from engine.metrics import psnr_frames
from engine.models import ModelInfo, Registry
from jobs.db.connect import session_factory, upgrade
from jobs.settings import Settings
from storage.encode import decode_frames, encode_mp4
from storage.stores import open_store

STAGES = ("text", "denoise", "decode", "encode", "upload")


@dataclass(frozen=True)
class Preset:
    name: str
    why: str
    model: str  # a bench model built into the cache (engine.bench_models), or "tiny"
    width: int
    height: int
    frames: int
    fps: int
    steps: int
    guidance: float
    videos: int
    batch: int
    max_sequence_length: int = 512
    temporal_factor: int = 4


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu",
        "Wan2.1-1.3B's layer widths (hidden 1536, ffn 8960) in 2 blocks at 128x128, 17 frames: the denoiser's matmuls "
        "have the real model's shapes, and with 8 steps denoising is most of the wall time, as for real models.",
        model="bench-wan-widths-v1", width=128, height=128, frames=17, fps=16, steps=8, guidance=5.0,
        videos=8, batch=4,
    ),
    "small": Preset(
        "small",
        "Previews and thumbnails: short 32x32 clips of the trained toy model (smooth frames, like real previews), "
        "where per-call overhead, decoding and encoding are a large share of each video, so batching and overlap "
        "matter most.",
        model="toy", width=32, height=32, frames=9, fps=8, steps=20, guidance=5.0, videos=32, batch=16,
        max_sequence_length=64, temporal_factor=2,
    ),
    "wan-1.3b": Preset(
        "wan-1.3b",
        "The full Wan2.1-T2V-1.3B architecture with random weights (the real model's compute) at its published "
        "defaults: 832x480, 81 frames, 50 steps, guidance 5, bf16. For a GPU.",
        model="bench-wan-1.3b-v1", width=832, height=480, frames=81, fps=16, steps=50, guidance=5.0,
        videos=8, batch=4,
    ),
}

# Ad-copy style prompts: distinct texts, so the text cache helps only where a real run would repeat itself (the
# shared empty negative prompt).
SUBJECTS = ("a red sports car", "a golden retriever", "a city skyline", "a cup of coffee", "a mountain lake",
            "a running shoe", "a paper boat", "a neon sign")
SCENES = ("at sunrise", "in the rain", "in slow motion", "on a wooden table")


def prompts(count: int, model: str = "") -> list[str]:
    """`count` distinct prompts; for the toy model, prompts of its grammar (the quality sample set's)."""
    if model == "toy":
        from jobs.quality.evaluate import sample_set

        return [case.prompt for case in sample_set(count)]
    return [f"{SUBJECTS[i % len(SUBJECTS)]} {SCENES[(i // len(SUBJECTS)) % len(SCENES)]}, take {i}"
            for i in range(count)]


@dataclass
class Side:
    name: str
    videos: int = 0
    wall_s: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    @property
    def videos_per_hour(self) -> float:
        return 3600.0 * self.videos / self.wall_s if self.wall_s else 0.0

    @property
    def compute_s(self) -> float:
        return self.stages.get("denoise", 0.0) + self.stages.get("decode", 0.0)

    def to_dict(self) -> dict:
        return {"videos": self.videos, "wall_s": self.wall_s, "videos_per_hour": self.videos_per_hour,
                "stages": self.stages, "wall_over_compute": self.wall_s / self.compute_s if self.compute_s else None,
                "config": self.config}


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
    baseline_denoise_mfu: float
    denoise_mfu: float

    @property
    def speedup(self) -> float:
        return self.engine.videos_per_hour / self.baseline.videos_per_hour

    @property
    def denoise_floor_s(self) -> float:
        """The least denoising time per video this machine allows: its FLOPs at the measured matmul peak."""
        return self.denoise_gflop / self.peak_gflops

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("baseline", "engine")}
        return {**d, "baseline": self.baseline.to_dict(), "engine": self.engine.to_dict(), "speedup": self.speedup,
                "denoise_floor_s": self.denoise_floor_s}


# ---- the machine's limit ------------------------------------------------------------------------------------------


def measure_peak_gflops(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> float:
    """Best-of-`repeats` GFLOP/s of one n x n matmul: what this machine's matmul units deliver in this dtype."""
    n = n or (8192 if device.type == "cuda" else 4096)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if i:  # the first is warm-up
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def denoise_gflop(pipe, preset: Preset, device: torch.device) -> float:
    """GFLOP of one video's denoising: one transformer call counted by FlopCounterMode, times steps, times two when
    classifier-free guidance runs a second pass."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    t = pipe.transformer
    spatial, temporal = pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal
    latent = torch.zeros(1, t.config.in_channels, (preset.frames - 1) // temporal + 1, preset.height // spatial,
                         preset.width // spatial, device=device, dtype=t.dtype)
    text = torch.zeros(1, preset.max_sequence_length, t.config.text_dim, device=device, dtype=t.dtype)
    # torch counts the GPU attention kernels but not the CPU one; give it the same formula.
    aten = torch.ops.aten
    def cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    counter = FlopCounterMode(display=False,
                              custom_mapping={aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention})
    with torch.inference_mode(), counter:
        t(latent, torch.tensor([500.0], device=device), text, return_dict=False)
    passes = 2 if preset.guidance > 1.0 else 1
    return counter.get_total_flops() * preset.steps * passes / 1e9


# ---- baseline: the diffusers script --------------------------------------------------------------------------------


class _StageTimer:
    """Wraps a pipeline's encode_prompt and vae.decode to time them, waiting for the device at each end."""

    def __init__(self, pipe, device: torch.device):
        self.device, self.seconds = device, {"text": 0.0, "decode": 0.0}
        pipe.encode_prompt = self._timed("text", pipe.encode_prompt)
        pipe.vae.decode = self._timed("decode", pipe.vae.decode)

    def _timed(self, stage: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            _sync(self.device)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync(self.device)
                self.seconds[stage] += time.perf_counter() - t0

        return wrapper


def load_baseline(path: Path, device: torch.device, dtype: torch.dtype):
    """The pipeline as the diffusers docs load Wan: the VAE in fp32, the rest in the working dtype."""
    from diffusers import AutoencoderKLWan, WanPipeline

    vae = AutoencoderKLWan.from_pretrained(path, subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(path, vae=vae, torch_dtype=dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_baseline(pipe, preset: Preset, cases: list[tuple[str, int]], out: Path, device: torch.device,
                 dtype: torch.dtype, on_video: Callable[[], None] | None = None
                 ) -> tuple[Side, dict[int, tuple[np.ndarray, bytes]]]:
    store = open_store(out.as_uri() + "/")

    def one(prompt: str, seed: int) -> np.ndarray:
        frames = pipe(prompt=prompt, height=preset.height, width=preset.width, num_frames=preset.frames,
                      num_inference_steps=preset.steps, guidance_scale=preset.guidance,
                      generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      max_sequence_length=preset.max_sequence_length).frames[0]
        return np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)

    one(cases[0][0] + " (warm-up)", cases[0][1] + 10**6)
    timer = _StageTimer(pipe, device)
    side = Side("baseline", config={"pipeline": "WanPipeline.__call__, one prompt per call", "dtype": str(dtype),
                                    "vae_dtype": "torch.float32", "max_sequence_length": preset.max_sequence_length})
    encode_s = upload_s = 0.0
    videos: dict[int, tuple[np.ndarray, bytes]] = {}
    started = time.perf_counter()
    for i, (prompt, seed) in enumerate(cases):
        frames = one(prompt, seed)
        t0 = time.perf_counter()
        data = encode_mp4(frames, preset.fps)
        t1 = time.perf_counter()
        store.put(f"{i}.mp4", data, sha256=hashlib.sha256(data).hexdigest(), metadata={"seed": str(seed)})
        upload_s += time.perf_counter() - t1
        encode_s += t1 - t0
        videos[i] = (frames, data)
        if on_video:
            on_video()
    side.wall_s = time.perf_counter() - started
    side.videos = len(cases)
    pipeline_s = side.wall_s - encode_s - upload_s
    side.stages = {"text": timer.seconds["text"], "decode": timer.seconds["decode"], "encode": encode_s,
                   "upload": upload_s}
    # Everything else inside the pipeline call is the denoising loop and its setup.
    side.stages["denoise"] = pipeline_s - timer.seconds["text"] - timer.seconds["decode"]
    side.stages["other"] = 0.0
    return side, videos


# ---- reelbatch: the worker path -----------------------------------------------------------------------------------


def run_engine(info: ModelInfo, preset: Preset, cases: list[tuple[str, int]], work: Path, settings: Settings,
               on_video: Callable[[], None] | None = None) -> tuple[Side, dict[int, tuple[np.ndarray, bytes]]]:
    from jobs.db import queries
    from jobs.manifest.load import load_manifest
    from jobs.db.rows import Video
    from jobs.render.batch import Finisher, render_next_batch, warm_up

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
    from engine.bench_models import ensure_bench_model
    from engine.models import ModelDefaults, builtin_models
    from engine.tiny import ensure_tiny

    builtin = builtin_models()
    if preset.model in builtin:
        info = builtin[preset.model]
        return dataclasses.replace(info, path=ensure_tiny(cache_dir), builtin=False) if info.builtin else info
    return ModelInfo(
        name=preset.model,
        defaults=ModelDefaults(preset.width, preset.height, preset.fps, preset.frames / preset.fps, preset.steps,
                               preset.guidance),
        path=ensure_bench_model(cache_dir, preset.model),
        temporal_factor=preset.temporal_factor,
        max_frames=max(81, preset.frames),
        max_sequence_length=preset.max_sequence_length,
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
               "guidance": preset.guidance, "videos": n},
        baseline=baseline, engine=engine, min_psnr_db=min(psnr_db), psnr_db=psnr_db,
        min_psnr_mp4_db=min(psnr_mp4_db), denoise_gflop=gflop, peak_gflops=peak,
        baseline_denoise_mfu=gflop * n / baseline.stages["denoise"] / peak,
        denoise_mfu=gflop * n / engine.stages["denoise"] / peak,
    )


def _engine_settings(settings: Settings, work: Path, preset: Preset) -> Settings:
    """The operator's engine switches, on a throwaway database, store and cache (so the text cache starts cold)."""
    from dataclasses import replace

    return replace(
        settings,
        database_url=f"sqlite:///{work / 'bench.db'}",
        output=(work / "engine").as_uri() + "/",
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
