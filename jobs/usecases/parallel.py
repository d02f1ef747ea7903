"""A worker of several ranks (one video on several GPUs: engine.group, engine.parallel) as the worker command and
submit see it: the layout the settings ask for, refused with the setting and its value where it cannot render here
(a pool or device count that does not match it, a served model whose attention heads it does not divide) or where a
manifest's video cannot be split (its latent tokens)."""

from __future__ import annotations

from pathlib import Path

from engine.models.envelope import tokens
from engine.models.shape_rules import heads_of, rules_of
from engine.parallel import Layout, problem
from jobs.errors import UsageError
from jobs.manifest.specs import ManifestIssue, RunSpec
from jobs.settings import Settings
from jobs.usecases.envelopes import refuse


def layout(settings: Settings) -> Layout:
    return Layout(settings.engine.ulysses, settings.engine.cfg_parallel, settings.engine.ring)


def setting(settings: Settings) -> str:
    """The settings that chose the layout, as an error names them."""
    e = settings.engine
    ring = f", REELBATCH_RING={e.ring} (--ring)" if e.ring > 1 else ""
    return f"REELBATCH_ULYSSES={e.ulysses} (--ulysses){ring}, REELBATCH_CFG_PARALLEL={e.cfg_parallel}"


def check_worker(settings: Settings, served: tuple[str, ...], pool: str, concurrency: int,
                 visible_gpus: int | None) -> None:
    """Refuse to start a worker whose layout cannot render here. `visible_gpus`: the GPUs this process sees (None on
    a machine without CUDA)."""
    shape = layout(settings)
    gpus = settings.worker.gpus
    if gpus is not None and len(gpus) != shape.ranks:
        raise UsageError(f"--gpus / REELBATCH_GPUS={','.join(map(str, gpus))}: {len(gpus)} GPUs for a worker of "
                         f"{shape.ranks} ranks ({setting(settings)}): give one GPU a rank")
    if shape.ranks == 1:
        return
    if pool != "solo" or concurrency != 1:
        raise UsageError(f"{setting(settings)}: a worker of {shape.ranks} ranks renders in one process with "
                         f"--pool solo --concurrency 1 (its ranks are its other processes), got --pool {pool} "
                         f"--concurrency {concurrency}")
    device = settings.engine.torch_device().type
    if device == "cuda":
        if visible_gpus is not None and visible_gpus < shape.ranks:
            raise UsageError(f"{setting(settings)}: {shape.ranks} ranks need {shape.ranks} GPUs, this machine shows "
                             f"{visible_gpus}" + (f" of --gpus {','.join(map(str, gpus))}" if gpus else ""))
    elif gpus is not None:
        raise UsageError(f"--gpus / REELBATCH_GPUS: this worker renders on {device} (REELBATCH_DEVICE="
                         f"{settings.engine.device}), not on GPUs; its {shape.ranks} ranks are processes of it")
    from engine.models.tiny import ensure_builtin  # torch: only where a worker starts

    registry = settings.registry()
    for model in served:
        info = registry.get(model)
        heads = (heads_of(ensure_builtin(settings.engine.cache_dir, model)) if info.builtin
                 else heads_of(info.path, info.base))
        why = problem(shape, heads, shape.ulysses * shape.ring) if heads is not None else None
        if why is not None:
            raise UsageError(f"{setting(settings)}: model {model}: {why}")


def check(settings: Settings, manifest: Path | str, spec: RunSpec) -> None:
    """Refuse a run with a video the settings' layout cannot split (its latent tokens, or its model's heads, not a
    multiple of the ranks that split them): ManifestError naming each such video's line. With one rank, nothing."""
    shape = layout(settings)
    if shape.ulysses * shape.ring == 1:
        return
    info = settings.registry().get(spec.model)
    rules = rules_of(info)
    heads = None if info.builtin else heads_of(info.path, info.base)  # a built-in's: checked where a worker starts
    issues = []
    for n, v in enumerate(spec.videos):
        each = tokens(rules, v.width, v.height, v.window or v.frames)
        why = problem(shape, heads or shape.ulysses, each)
        if why is not None:
            issues.append(ManifestIssue(str(manifest), v.line, f"videos[{n}].resolution",
                                        f"{v.width}x{v.height}, {v.window or v.frames} frames a pass on "
                                        f"{spec.model}: {setting(settings)}: {why}"))
    refuse(manifest, issues, "the layout cannot split")
