"""`reelbatch bench --quality`: each lossy accelerator or precision below native (engine.precision, `--precision`)
against exact mode on a judgeable model, and its gate.

Exact mode is the engine as configured with the lossy accelerators off (its output is what a plain diffusers call
computes, to the last bits the lossless switches may round). Every setting renders the same fixed sample set
(jobs.quality.evaluate.sample_set) at the same batch size after a warm-up; the report puts side by side its speedup in render
seconds, PSNR and SSIM of its frames against exact mode's, and prompt adherence judged from the decoded MP4s. Each
setting's gate (engine.gates) is recorded under the cache folder: only then may a worker use it.

Speed is timed in alternation (exact, setting, exact, setting) and the faster of each pair of runs kept: on a shared
machine a one-off timing of a few seconds drifts by 30%, alternation cancels the drift.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import numpy as np

from engine import gates
from engine.config import EngineConfig
from engine.engine import Engine
from engine.metrics import psnr, ssim
from engine.models import Registry
from engine.precision import NATIVE, PrecisionRefused, check_mode, lossy
from engine.toy.judge import score
from jobs.errors import UsageError
from jobs.quality.evaluate import native_shape, render_cases, round_trip
from jobs.quality.sample import sample_set
from jobs.settings import Settings

ATTRIBUTES = ("colour", "shape", "direction", "background", "all_four")


@dataclass
class QualityBench:
    model: str
    shape: dict
    count: int
    batch: int
    exact_s: float  # the first timed exact run; each setting's speedup uses the exact runs around its own
    exact_adherence: dict[str, float]
    gates: list[gates.Gate] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"model": self.model, "shape": self.shape, "count": self.count, "batch": self.batch,
                "exact": {"seconds": self.exact_s, "adherence": self.exact_adherence},
                "settings": [g.to_dict() for g in self.gates],
                "passed": [g.setting for g in self.gates if g.passed]}


def lossy_configs(base: EngineConfig, settings: list[str], precisions: list[str] = ()) -> list[EngineConfig]:
    """One config per setting (and per precision, each setting at each: engine.precision); a malformed one is a
    usage error naming --setting or --precision and its value. With precisions, "" is a setting: the precision
    alone."""
    for mode in precisions:
        try:
            check_mode(mode)
        except ValueError as exc:
            raise UsageError(f"--precision: {exc}") from None
    configs = []
    for text in settings:
        try:
            config = base.with_lossy(text)
        except ValueError as exc:
            raise UsageError(f"--setting {text!r}: {exc}") from None
        if not config.lossy() and not precisions:
            raise UsageError(f"--setting {text!r}: turns no lossy accelerator on")
        configs += [replace(config, precision=mode) for mode in precisions] or [config]
    return configs


def run_quality_bench(settings: Settings, model: str, candidates: list[str], *, count: int, batch: int,
                      on_setting: Callable[[str], None] | None = None, precisions: list[str] = ()) -> QualityBench:
    registry = settings.registry()
    shape, fps = native_shape(registry, model)
    base = settings.engine_config().lossless()
    configs = lossy_configs(base, candidates, precisions)
    # The measured model at each config's precision, whatever its registration names (exact mode: native).
    at_mode = Registry({**registry.models, model: replace(registry.get(model), precision=None)})
    cases = sample_set(count)
    exact_engine = Engine(base, registry)
    identity = exact_engine.gate_identity(registry.get(model))  # the key Engine.check_gate reads
    engines = [_measured_engine(config, at_mode, model) for config in configs]  # refused before any render

    def timed(engine: Engine) -> tuple[float, list[np.ndarray]]:
        started = time.perf_counter()
        videos = render_cases(engine, shape, cases, batch)
        return time.perf_counter() - started, videos

    def adherence(videos: list[np.ndarray]) -> dict[str, float]:
        scores = score((case.prompt, round_trip(video, fps)) for case, video in zip(cases, videos))
        return {name: getattr(scores, name) for name in ATTRIBUTES}

    if on_setting:
        on_setting("exact")
    render_cases(exact_engine, shape, cases[:batch], batch)  # warm-up: model loaded, caches filled
    exact_s, exact_videos = timed(exact_engine)
    exact_adherence = adherence(exact_videos)
    exact_times = [exact_s]
    result = QualityBench(model, {"width": shape.width, "height": shape.height, "frames": shape.frames,
                                  "steps": shape.steps, "guidance": shape.guidance, "fps": fps},
                          count, batch, exact_s, exact_adherence)
    for config, engine in zip(configs, engines):
        setting = engine.pipelines.gate_setting(model)
        if on_setting:
            on_setting(setting)
        render_cases(engine, shape, cases[:batch], batch)
        first_s, videos = timed(engine)
        exact_times.append(timed(exact_engine)[0])
        seconds = min(first_s, timed(engine)[0])
        psnrs = [psnr(v, e) for v, e in zip(videos, exact_videos)]
        ssims = [ssim(v, e) for v, e in zip(videos, exact_videos)]
        measured = adherence(videos)
        gate = gates.Gate(
            model=model, identity=identity, setting=setting, count=count, batch=batch,
            speedup=min(exact_times[-2:]) / seconds, psnr_db_min=float(min(psnrs)), psnr_db_mean=float(np.mean(psnrs)),
            ssim_min=float(min(ssims)), adherence=measured, exact_adherence=exact_adherence,
            measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            failures=gates.judge(measured, exact_adherence, float(np.mean(psnrs))),
        )
        gates.record(settings.cache_dir, gate)
        result.gates.append(gate)
    return result


def _measured_engine(config: EngineConfig, registry: Registry, model: str) -> Engine:
    """An engine that renders `model` with `config`'s lossy settings, its gate not required (measuring is what the
    gate is for); a precision this device cannot run, or one that is native here (nothing to gate), is a usage
    error naming --precision."""
    engine = Engine(config, registry)
    engine.gate_checked.add(model)
    if config.precision != NATIVE:
        try:
            engine.pipelines.check_precision(model)
        except PrecisionRefused as exc:
            raise UsageError(f"--precision {config.precision}: {exc}") from None
        if not lossy(engine.pipelines.precision(model), engine.pipelines.native()):
            raise UsageError(f"--precision {config.precision}: {model!r} renders at {engine.pipelines.native()} here "
                             "(native), or fp32: lossless, no gate to measure")
    return engine
