"""`reelbatch bench quality`: each lossy accelerator or precision below native (engine.levers.precision, `--precision`)
against exact mode on a judgeable model, and its gate.

Exact mode is the engine as configured with the lossy accelerators off (its output is what a plain diffusers call
computes, to the last bits the lossless switches may round). Every setting renders the same sample
(jobs.quality.gate_sample: the user's manifest, a toy held-out draw, or the shipped prompts) at the same batch size
after a warm-up; the report puts side by side its speedup in render seconds, PSNR and SSIM of its frames against
exact mode's, and, on the toy world, prompt adherence judged from the decoded MP4s. Each setting's gate
(engine.levers.gates) is recorded under the cache folder: only then may a worker use it.

Speed is timed in alternation (exact, setting, exact, setting) and the faster of each pair of runs kept: on a shared
machine a one-off timing of a few seconds drifts by 30%, alternation cancels the drift.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from engine.engine import Engine
from engine.frames.metrics import psnr, ssim
from engine.levers import gate_rules, gates
from engine.levers.config import EngineConfig
from engine.levers.precision import NATIVE, PrecisionRefused, check_mode, lossy
from engine.models.registry import Registry
from jobs.errors import UsageError
from jobs.quality.gate_sample import gate_sample, judged, judged_adherence, render_sample
from jobs.settings import Settings

ATTRIBUTES = ("colour", "shape", "direction", "background", "all_four")


@dataclass
class QualityBench:
    model: str
    shape: dict
    count: int
    batch: int
    exact_s: float  # the first timed exact run; each setting's speedup uses the exact runs around its own
    exact_adherence: dict[str, float]  # {} where no judge reads the sample's prompts
    gates: list[gates.Gate] = field(default_factory=list)
    sample: str = ""  # jobs.quality.gate_sample.GateSample.label

    def to_dict(self) -> dict:
        return {"model": self.model, "sample": self.sample, "shape": self.shape, "count": self.count,
                "batch": self.batch, "min_sample": gates.MIN_SAMPLE,
                "exact": {"seconds": self.exact_s, "adherence": self.exact_adherence},
                "settings": [g.to_dict() for g in self.gates],
                "passed": [g.setting for g in self.gates if g.passed],
                "released": [g.setting for g in self.gates if g.releases]}


def lossy_configs(base: EngineConfig, settings: list[str], precisions: list[str] = ()) -> list[EngineConfig]:
    """One config per setting (and per precision, each setting at each: engine.levers.precision); a malformed one is a
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
        if not config.lossy() and config.text_encoder_precision == NATIVE and not precisions:
            raise UsageError(f"--setting {text!r}: turns no lossy accelerator on")
        configs += [replace(config, precision=mode) for mode in precisions] or [config]
    return configs


def run_quality_bench(settings: Settings, model: str, candidates: list[str], *, count: int, batch: int,
                      prompts: Path | None = None, on_setting: Callable[[str], None] | None = None,
                      precisions: list[str] = (), entropy: int | None = None) -> QualityBench:
    """Each candidate (a lossy setting, a precision below native, or both) against exact mode on the gate's sample
    (jobs.quality.gate_sample: `prompts`' videos, a toy held-out draw, or the shipped prompts), its gate recorded."""
    registry = settings.registry()
    base = settings.engine_config().lossless()
    configs = lossy_configs(base, candidates, precisions)
    sample = gate_sample(registry, model, prompts=prompts, count=count, entropy=entropy)
    # The measured model at each config's precision, whatever its registration names (exact mode: native).
    at_mode = Registry({**registry.models, model: replace(registry.get(model), precision=None,
                                                          text_encoder_precision=None)})
    exact_engine = Engine(base, registry)
    identity = exact_engine.gate_identity(registry.get(model))  # the key Engine.check_gate reads
    engines = [_measured_engine(config, at_mode, model) for config in configs]  # refused before any render
    warm = replace(sample, items=sample.items[:batch])

    def timed(engine: Engine) -> tuple[float, list[np.ndarray]]:
        started = time.perf_counter()
        videos = render_sample(engine, sample, batch)
        return time.perf_counter() - started, videos

    if on_setting:
        on_setting("exact")
    render_sample(exact_engine, warm, batch)  # warm-up: model loaded, caches filled
    exact_s, exact_videos = timed(exact_engine)
    exact_adherence = judged_adherence(sample, exact_videos)
    exact_measures = gate_rules.Measured.of(exact_videos)  # flicker, motion, blank frames, frozen videos
    exact_times = [exact_s]
    first = sample.items[0]
    shape = {"width": first.shape.width, "height": first.shape.height, "frames": first.shape.frames,
             "steps": first.shape.steps, "guidance": first.shape.guidance, "fps": first.fps,
             "shapes": len({i.shape for i in sample.items})}
    result = QualityBench(model, shape, len(sample), batch, exact_s, exact_adherence, sample=sample.label)
    for config, engine in zip(configs, engines):
        setting = engine.pipelines.gate_setting(model)
        if on_setting:
            on_setting(setting)
        render_sample(engine, warm, batch)
        first_s, videos = timed(engine)
        exact_times.append(timed(exact_engine)[0])
        seconds = min(first_s, timed(engine)[0])
        psnrs = [psnr(v, e) for v, e in zip(videos, exact_videos)]
        ssims = [ssim(v, e) for v, e in zip(videos, exact_videos)]
        measured, read_right = judged(sample, videos)
        mine = gate_rules.Measured.of(videos)
        gate = gates.Gate(
            model=model, identity=identity, setting=setting, count=len(sample), batch=batch,
            speedup=min(exact_times[-2:]) / seconds, psnr_db_min=float(min(psnrs)), psnr_db_mean=float(np.mean(psnrs)),
            ssim_min=float(min(ssims)), adherence=measured, exact_adherence=exact_adherence,
            measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            failures=gate_rules.judge(measured, exact_adherence, float(np.mean(psnrs)), ssims, mine, exact_measures,
                                 read_right),
            sample=sample.label, flicker=mine.flicker, teacher_flicker=exact_measures.flicker,
            blank_frames=mine.blank, teacher_blank_frames=exact_measures.blank, motion=mine.motion,
            teacher_motion=exact_measures.motion, frozen_videos=mine.frozen,
            teacher_frozen_videos=exact_measures.frozen,
        )
        gates.record(settings.engine.cache_dir, gate)
        result.gates.append(gate)
    return result


def _measured_engine(config: EngineConfig, registry: Registry, model: str) -> Engine:
    """An engine that renders `model` with `config`'s lossy settings, its gate not required (measuring is what the
    gate is for); a precision this device cannot run, or one that is native here (nothing to gate), is a usage
    error naming --precision."""
    if config.ulysses * config.cfg_parallel * config.ring > 1:  # `--setting ring=2`: this process is rank 0
        from engine.group import GroupEngine

        engine = GroupEngine(config, registry, measuring=[model])
    else:
        engine = Engine(config, registry, measuring=[model])
    pipes, native = engine.pipelines, engine.pipelines.native()
    asked = [(f"--precision {config.precision}", config.precision, pipes.precision, f"{model!r} renders"),
             (f"--setting text_encoder_precision={config.text_encoder_precision}", config.text_encoder_precision,
              pipes.text_encoder_precision, f"{model!r}'s text encoder renders")]
    for where, mode, resolved, what in asked:
        if mode == NATIVE:
            continue
        try:
            pipes.check_precision(model)
        except PrecisionRefused as exc:
            raise UsageError(f"{where}: {exc}") from None
        if not lossy(resolved(model), native):
            raise UsageError(f"{where}: {what} at {native} here (native), or fp32: lossless, no gate to measure")
    return engine
