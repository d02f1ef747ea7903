"""What each side of a bench renders: the preset's model (a built-in one, or a bench model built into the cache),
or with `--model` a registration at its own defaults against its teacher at the teacher's; and the gate check a
worker would make before rendering it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.models.families import read_folder
from engine.models.registry import ModelDefaults, ModelInfo, Registry, builtin_models
from engine.models.tiny import ensure_builtin
from jobs.bench.models import FAST, bench_fast_info, ensure_bench_model
from jobs.bench.presets import Preset
from jobs.bench.side import SideModel
from jobs.errors import UsageError
from jobs.quality.evaluate import gated_engine
from jobs.settings import Settings


def bench_model(preset: Preset, cache_dir: Path) -> ModelInfo:
    """A built-in model as registered (tiny built into the cache on first use), or a bench model built likewise."""
    builtin = builtin_models()
    if preset.model in builtin:
        return built(builtin[preset.model], cache_dir)
    path = ensure_bench_model(cache_dir, preset.model)
    # The folder says its family, as for a registered one (engine.models.families): Wan 2.2's switch and size grid.
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


def side_models(preset: Preset, settings: Settings, model: str | None) -> tuple[SideModel, SideModel]:
    """What each side renders: (baseline, engine). The preset's model at its steps and guidance on both sides;
    with `model` (a registered name) the engine renders it at its defaults and the baseline its teacher (or itself)
    at the teacher's; with the preset's `engine_model`, the engine renders that bench registration at its own."""
    base = bench_model(preset, settings.engine.cache_dir)
    baseline = SideModel(base, preset.steps, preset.guidance)
    name = model or preset.engine_model
    if name is None:
        return baseline, baseline
    if model is None and name == FAST:
        fast = bench_fast_info(settings.engine.cache_dir, base.defaults)
        return baseline, SideModel(fast, fast.defaults.steps, fast.defaults.guidance)
    registry = settings.registry()
    if name not in registry:
        raise UsageError(f"--model: {name!r} is not registered (registered: {', '.join(registry.names())})")
    info = registry.get(name)
    teacher = registry.get(info.teacher) if info.teacher else info
    if teacher.adapters or teacher.sampler or teacher.decoder:
        raise UsageError(f"--model {name}: the baseline renders {teacher.name!r} with the plain diffusers script, "
                         f"which cannot apply its adapters, sampler or decoder")
    return (SideModel(built(teacher, settings.engine.cache_dir), teacher.defaults.steps, teacher.defaults.guidance),
            SideModel(built(info, settings.engine.cache_dir), info.defaults.steps, info.defaults.guidance))


def check_gates(settings: Settings, info: ModelInfo) -> None:
    """Refuse, before rendering anything, what a worker would refuse: a distilled registration whose gate against
    its teacher has not passed, or a lossy setting without its gate."""
    gated_engine(settings, Registry({info.name: info}), info.name)


def built(info: ModelInfo, cache_dir: Path) -> ModelInfo:
    """A built-in model with its folder's path filled in (tiny is built into the cache on first use)."""
    if info.builtin:
        return dataclasses.replace(info, path=ensure_builtin(cache_dir, info.name), builtin=False)
    return info
