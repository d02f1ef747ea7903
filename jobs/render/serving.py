"""What a worker serves, before it claims: the models whose gates pass (gated_models, serving), the shapes it
compiles ahead (warm_up), and how long a claimed batch may take (batch_time_limit)."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from engine.engine import Engine
from engine.levers.gates import UngatedSetting
from engine.models.shape_rules import rules_of
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.claims.claims import Serving, waiting_shapes
from jobs.db.queries import Factory
from jobs.render import envelopes, warm_bundles
from jobs.settings import Settings

log = logging.getLogger(__name__)

# The reference for time limits: one Wan 480p, 81-frame, 50-step video with classifier-free guidance.
REFERENCE_WORK = 832 * 480 * 81 * 50 * 2


def batch_time_limit(settings: Settings, shape: Shape, videos: int) -> float:
    """The settings' limit for the reference video, scaled by this batch's work (pixels x frames x steps x CFG)."""
    work = shape.width * shape.height * shape.frames * shape.steps * (2 if shape.guidance > 1 else 1) * videos
    return max(settings.limits.min_time_limit_s, settings.limits.time_limit_s * work / REFERENCE_WORK)


def gated_models(engine: Engine, models: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Of `models`, those `engine` may render (every lever it would use on each, and a distilled registration
    itself, has a passing gate: engine.levers.gates) and those it may not. A worker claims only the first; its session
    records the second, so `reelbatch status` can say why their work waits. Asked at each claim, so a gate recorded
    while the worker runs lets it take that model's work."""
    ok, ungated = [], []
    for model in models:
        try:
            engine.check_gate(model)
        except UngatedSetting:
            ungated.append(model)
        else:
            ok.append(model)
    return tuple(ok), tuple(ungated)


def serving(settings: Settings, engine: Engine, factory: Factory | None = None) -> Serving:
    """What this worker claims (jobs.claims.claims.Serving): the models it serves whose gates passed
    (gated_models), their registrations' batch limits, what its engine has warm, and with a `factory` its device's
    memory envelopes (jobs.render.envelopes)."""
    registry = engine.registry
    models = gated_models(engine, settings.served_models(registry))[0]
    limits = {m: registry.get(m).max_batch for m in models if registry.get(m).max_batch}
    kept = envelopes.for_worker(settings, factory) if factory is not None else {}
    fits = {m: (kept[m], rules_of(registry.get(m))) for m in models if m in kept}
    split = settings.engine.ulysses * settings.engine.ring
    rules = {m: rules_of(registry.get(m)) for m in models} if split > 1 else {}
    return Serving(models, limits, engine.loaded(), engine.last_shape, settings.worker.affinity_s, engine.warm_shapes,
                   fits, split, rules)


def warm_up(settings: Settings, engine: Engine, factory: Factory, shapes: int = 4) -> list[str]:
    """Compile ahead: for each of the `shapes` shapes with the most work waiting, one denoising step of a batch the
    size the worker will claim, so its first real batch runs compiled code (a compile costs 15-25 s per shape on a
    CPU, more for a large model). Returns the shape keys warmed."""
    warmed = []
    served = serving(settings, engine, factory)
    for shape, waiting in waiting_shapes(factory, shapes, served.models):
        size = min(served.limit(shape.key(), shape.model, settings.worker.max_batch), waiting)
        if size < 1:
            continue  # no video of it fits this device's envelope: another worker takes it
        # A model that renders every video from an image warms up from a black one.
        image = None
        if shape.model in engine.registry and engine.registry.get(shape.model).image_condition == "pipeline":
            image = np.zeros((shape.height, shape.width, 3), dtype=np.uint8)
        requests = tuple(RenderRequest(-1 - i, "warm-up", None, i, image=image) for i in range(size))
        key = fetched = None
        try:
            if settings.worker.warm_uri is not None:
                engine.pipeline(shape.model)  # loaded first: it names Inductor's folder, compiled at first use
                key = warm_bundles.bundle_key(engine, shape)
                fetched = warm_bundles.fetch(settings.worker.warm_uri, key, warm_bundles.inductor_dir())
            stepped = replace(shape, steps=1)
            engine.render(RenderBatch(stepped, requests))
        except Exception as exc:  # noqa: BLE001 - a shape that cannot render fails its own videos, not the worker
            log.warning("warm-up of %s failed: %s", shape.key(), exc)
            continue
        engine.remember(shape, instead_of=stepped)  # claims prefer it now (jobs.claims.claims.Serving)
        if key is not None and not fetched:
            warm_bundles.publish(settings.worker.warm_uri, key, warm_bundles.inductor_dir())
        warmed.append(shape.key())
    return warmed
