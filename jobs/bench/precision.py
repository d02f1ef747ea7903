"""`reelbatch bench precision MODE`: one preset's videos rendered in exact mode, by the engine at native precision
and at each asked precision (engine.levers.precision), side by side: seconds, the transformer's weight bytes, the text
encoder's (each mode side with `--text-encoder MODE` quantizes it as a registration's `text_encoder_precision:` does),
peak memory and PSNR to exact mode's frames.

Every side renders the same prompts and seeds in the same process, one after another, after the model is loaded
(load seconds apart: an 8-bit side's include quantizing). Peak memory on a GPU is torch's peak allocation during
the side; on a CPU it is the process's resident memory sampled every 10 ms, above what it held when the side began,
with freed memory handed back to the system between sides (glibc's malloc_trim), so an earlier side's pages do not
hide a later side's. The modes are measured for speed whether or not their gate passed (workers refuse an ungated
one); each side says which.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from engine.engine import Engine
from engine.frames.metrics import psnr
from engine.levers import precision
from engine.levers.gates import UngatedSetting
from engine.loop.experts import experts
from engine.models.registry import Registry
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.bench.presets import Preset, prompts
from jobs.bench.sides import bench_model
from jobs.errors import UsageError
from jobs.settings import Settings


@dataclass
class PrecisionSide:
    name: str  # exact, native, or the mode
    precision: str  # what it rendered at, resolved
    load_s: float
    render_s: float
    weight_bytes: int  # the transformer(s), as held
    text_encoder_precision: str  # the text encoder's own mode, or the pipeline's precision when it has none
    text_encoder_bytes: int  # as held
    peak_mb: float
    psnr_db_min: float | None  # against exact mode; None for exact itself
    psnr_db_mean: float | None
    gate: str  # "passed", "native" (no gate needed), or why a worker would refuse it


def run_precision_bench(preset: Preset, settings: Settings, modes: list[str], videos: int | None = None,
                        on_side=None, text_encoder: str | None = None) -> dict:
    """`text_encoder`: the text encoder's own mode on every mode side (exact and native keep it native)."""
    for option, mode in [("MODE", m) for m in modes] + ([("--text-encoder", text_encoder)] if text_encoder else []):
        try:
            precision.check_mode(mode)
        except ValueError as exc:
            raise UsageError(f"{option}: {exc}") from None
    info = bench_model(preset, settings.engine.cache_dir)
    registry = Registry({info.name: info})
    shape = Shape(info.name, preset.width, preset.height, preset.frames, preset.steps, preset.guidance)
    count = videos or preset.videos
    texts = prompts(count, preset.model)
    config = settings.engine_config()
    configs = [("exact", config.exact()), ("native", config.lossless())]
    configs += [(mode, replace(config.lossless(), precision=mode, text_encoder_precision=text_encoder))
                for mode in modes]
    engines = []
    for name, cfg in configs:  # every side checked before any renders
        gate = _gate(Engine(cfg, registry), info.name)
        # Timed whether or not a worker may use it (`gate` says): measuring, its gate is not asked.
        engine = Engine(cfg, registry, measuring=[info.name])
        try:
            engine.pipelines.check_precision(info.name)
        except precision.PrecisionRefused as exc:
            raise UsageError(f"--precision {name}: {exc}") from None
        engines.append((name, cfg, gate))
    sides: list[PrecisionSide] = []
    exact_frames: list[np.ndarray] = []
    for name, cfg, gate in engines:
        if on_side:
            on_side(name)
        engine = Engine(cfg, registry, measuring=[info.name])
        side, frames = _measure(engine, name, shape, texts, preset.batch, gate)
        if name == "exact":
            exact_frames = frames
        else:
            scores = [psnr(a, b) for a, b in zip(frames, exact_frames)]
            side.psnr_db_min, side.psnr_db_mean = float(min(scores)), float(np.mean(scores))
        sides.append(side)
        del engine, frames  # the engine holds the only reference to its pipeline
        _release()
    device = config.torch_device()
    return {"preset": preset.name, "model": info.name, "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
            "shape": {"width": shape.width, "height": shape.height, "frames": shape.frames, "steps": shape.steps,
                      "videos": count, "batch": preset.batch},
            "sides": [asdict(s) for s in sides]}


def _gate(engine: Engine, model: str) -> str:
    pipes = engine.pipelines
    if not precision.lossy(pipes.precision(model), pipes.native()):
        return "native"
    try:
        pipes.check_gate(model)
    except UngatedSetting as exc:
        return f"workers refuse it: {exc}"
    return "passed"


def _measure(engine: Engine, name: str, shape: Shape, texts: list[str], batch: int,
             gate: str) -> tuple[PrecisionSide, list[np.ndarray]]:
    with _Peak(engine.config.torch_device()) as peak:
        started = time.perf_counter()
        pipe = engine.pipeline(shape.model)
        load_s = time.perf_counter() - started
        frames: list[np.ndarray] = []
        started = time.perf_counter()
        for start in range(0, len(texts), batch):
            requests = tuple(RenderRequest(start + i, text, None, 1000 + start + i)
                             for i, text in enumerate(texts[start : start + batch]))
            for video in engine.render(RenderBatch(shape, requests)):
                if video.frames is None:
                    raise UsageError(f"--precision {name}: {video.request.prompt!r}: {video.error}")
                frames.append(video.frames)
        render_s = time.perf_counter() - started
    weights = sum(precision.weight_bytes(m) for m in experts(pipe))
    mode = engine.pipelines.precision(shape.model)
    text_mode = engine.pipelines.text_encoder_precision(shape.model) or mode
    side = PrecisionSide(name, mode, load_s, render_s, weights, text_mode, precision.weight_bytes(pipe.text_encoder),
                         peak.mb, None, None, gate)
    return side, frames


class _Peak:
    """Peak memory during a block: torch's peak allocation on CUDA; on a CPU, the resident set sampled every 10 ms,
    above what it was when the block began."""

    def __init__(self, device: torch.device):
        self.device, self.mb = device, 0.0
        self._stop = threading.Event()

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        self._base = self._top = _rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self._top = max(self._top, _rss())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
            return
        self._stop.set()
        self._thread.join()
        self.mb = (max(self._top, _rss()) - self._base) / 2**20


def _rss() -> int:
    """This process's resident bytes (Linux's /proc; 0 elsewhere, where the CPU figure is then not measured)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _release() -> None:
    """Free the side's tensors and hand the freed memory back, so the next side's peak starts from a clean floor."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the CPU figures then include reused pages
        pass


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"
