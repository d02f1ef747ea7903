"""A worker's memory envelope (engine.models.envelope): measured once per model and device before work is taken
(`reelbatch bench envelope`, or a worker at start with REELBATCH_ENVELOPE=measure), kept in the database
(jobs.db.envelopes), and used at each claim for the largest batch of a shape.

The points are measured in a child process (engine.parallel.spawn) with glibc's mmap threshold fixed at 64 KiB,
so a freed block goes back to the system at once and the next peak is what it really takes
(engine.models.envelope.PeakMeter); the parent's own memory is not in them. Each point is one denoising step at the
model's guidance (more steps reuse the same memory) and the decode.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from dataclasses import dataclass, replace

from engine.models.envelope import Envelope, Point, device_identity, fit, tokens
from engine.models.registry import ModelInfo, Registry
from engine.models.shape_rules import rules_of
from engine.parallel import spawn
from jobs.db import envelopes as kept
from jobs.db.queries import Factory
from jobs.errors import ReelbatchError
from jobs.manifest.model_shape import plan_frames
from jobs.settings import Settings

log = logging.getLogger(__name__)

# glibc's variables for the measuring child: blocks of 64 KiB and more are mapped and unmapped one by one, and free
# memory at the heap's top is given back at once.
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


@dataclass(frozen=True)
class Size:
    width: int
    height: int
    frames: int
    batch: int

    def __str__(self) -> str:
        return f"{self.batch} x {self.width}x{self.height}, {self.frames} frames"


def plan(info: ModelInfo, width: int, height: int, frames: int) -> tuple[list[Size], list[Size]]:
    """The sizes the line is fitted on and the sizes held out to check it, around a base shape: the base at batches
    1 and 2, twice as wide, about twice as long (half as long when the base is the model's whole window); held out:
    half as wide again and between the lengths, twice as wide and high, and the other length at batch 2."""
    grid = info.spatial_multiple
    wide = _side(2 * width, grid)
    longer = min(info.max_frames, info.valid_frames(2 * frames - 1))
    if longer == frames:  # the base is the model's whole window: about half as long instead
        longer = info.valid_frames((frames + 1) // 2)
    between = info.valid_frames((frames + longer) // 2)
    fitted = [Size(width, height, frames, 1), Size(width, height, frames, 2), Size(wide, height, frames, 1),
              Size(width, height, longer, 1)]
    held = [Size(_side(width * 3 // 2, grid), height, between, 1), Size(wide, _side(2 * height, grid), frames, 1),
            Size(width, height, longer, 2)]
    return fitted, held


def default_frames(info: ModelInfo) -> int:
    """The frames of one pass of the model's default video: its duration's (as a manifest plans them), at most its
    window."""
    return min(plan_frames(info, info.defaults.duration_s, info.defaults.fps), info.max_frames)


def _side(n: int, grid: int) -> int:
    return max(grid, n // grid * grid)


def measure(settings: Settings, info: ModelInfo, sizes: list[Size]) -> tuple[str, int, int, list[Point | str]]:
    """(device, its memory, resident bytes, a Point or why it did not fit for each size), measured in a spawned
    child (engine.parallel.spawn, one process and no group)."""
    saved = {k: os.environ.get(k) for k in ALLOCATOR}
    os.environ.update(ALLOCATOR)  # read by the child's allocator when it starts
    try:
        (found,) = spawn(_child, (settings, info, sizes), ranks=1, backend=None, timeout_s=7200)
    except RuntimeError as exc:
        raise ReelbatchError(f"measuring {info.name}'s memory envelope: {exc}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return found


def _child(rank: int, settings: Settings, info: ModelInfo, sizes: list[Size]) -> tuple[str, int, int, list]:
    from engine.engine import Engine
    from engine.errors import RetryableRenderError
    from engine.models.envelope import PeakMeter, resident_bytes
    from engine.types import RenderBatch, RenderRequest, Shape

    engine = Engine(settings.engine_config(), Registry({info.name: info}))
    device = settings.engine_config().torch_device()
    name, memory = device_identity(device, settings.worker.device_memory_gib)
    rules = rules_of(info)

    def batch(size: Size) -> RenderBatch:
        shape = Shape(info.name, size.width, size.height, size.frames, 1, info.defaults.guidance)
        return RenderBatch(shape, tuple(RenderRequest(-1 - i, "a memory envelope", None, i) for i in range(size.batch)))

    engine.render(batch(replace(sizes[0], batch=1)))  # loads the model and warms its kernels: not a point
    resident = resident_bytes(device)
    points: list[Point | str] = []
    for size in sizes:
        try:
            with PeakMeter(device) as meter:
                engine.render(batch(size))
        except RetryableRenderError as exc:  # one video ran out of memory (engine.engine.Engine.render)
            points.append(f"{size}: {exc}")
            continue
        if batch(size).shape.key() in engine.max_batch:  # out of memory, split in halves: not this size's peak
            points.append(f"{size}: out of memory, split to {engine.max_batch[batch(size).shape.key()]}")
            continue
        points.append(Point(size.width, size.height, size.frames, size.batch,
                            tokens(rules, size.width, size.height, size.frames), meter.peak_bytes))
    return name, memory, resident, points


def envelope_of(info: ModelInfo, device: str, memory: int, resident: int, points: list[Point]) -> Envelope:
    fixed, per_token, per_pixel = fit(points)
    return Envelope(info.name, device, memory, resident, fixed, per_token, per_pixel)


def measured_with(info: ModelInfo) -> str:
    import diffusers
    import torch

    return json.dumps({"torch": torch.__version__, "diffusers": diffusers.__version__,
                       "guidance": info.defaults.guidance, "steps": 1})


def measure_and_record(settings: Settings, factory: Factory, info: ModelInfo) -> Envelope:
    """A worker's envelope for `info` on its device, measured on the plan around the model's default shape and kept."""
    fitted, _ = plan(info, info.defaults.width, info.defaults.height, default_frames(info))
    device, memory, resident, points = measure(settings, info, fitted)
    measured = [p for p in points if isinstance(p, Point)]
    if not measured:
        raise ReelbatchError(f"{info.name}: no batch of its default shape fits this device: {points[0]}")
    envelope = envelope_of(info, device, memory, resident, measured)
    kept.record(factory, envelope, measured, measured_with(info))
    log.info("memory envelope of %s on %s: %s", info.name, device, json.dumps(envelope.to_dict()))
    return envelope


# A worker's envelopes, read again this often (another worker's measurement or OOM may have changed them).
REREAD_S = 60.0
_held: dict[tuple[str, str], tuple[float, dict[str, Envelope]]] = {}


def this_device(settings: Settings) -> str:
    """This process's device as envelopes name it (engine.models.envelope.device_identity)."""
    return _device(settings.engine_config().torch_device().type, settings.worker.device_memory_gib)


@functools.lru_cache(maxsize=8)
def _device(kind: str, memory_gib: float | None) -> str:
    import torch

    return device_identity(torch.device(kind), memory_gib)[0]


def for_worker(settings: Settings, factory: Factory, now: float | None = None) -> dict[str, Envelope]:
    """The envelopes kept for this worker's device, by model ({} with REELBATCH_ENVELOPE=off), read at most every
    REREAD_S seconds."""
    if settings.worker.envelope == "off":
        return {}
    now = time.monotonic() if now is None else now
    key = (settings.database_url, this_device(settings))
    held = _held.get(key)
    if held is None or now - held[0] >= REREAD_S:
        held = (now, {e.model: e for e in kept.load(factory, device=key[1])})
        _held[key] = held
    return held[1]


def after_oom(settings: Settings, factory: Factory, info: ModelInfo, shape, batch: int) -> Envelope | None:
    """`batch` videos of `shape` ran out of memory though the envelope let them start: the kept envelope shrinks so
    they no longer fit, and is read again at the next claim."""
    device = this_device(settings)
    smaller = kept.shrink(factory, info.name, device, batch, tokens(rules_of(info), shape.width, shape.height,
                                                                    shape.frames), shape.width, shape.height,
                          shape.key())
    _held.pop((settings.database_url, device), None)
    if smaller is not None:
        log.warning("out of memory at %d x %s: %s's envelope on %s shrunk (%d so far)", batch, shape.key(),
                    info.name, device, smaller.ooms)
    return smaller


def measure_missing(settings: Settings, factory: Factory, registry: Registry, models) -> list[str]:
    """A worker's start with REELBATCH_ENVELOPE=measure: the envelope of each of `models` not yet kept for this
    device, measured and kept (once per device and model: the next worker on such a device reads it). A model that
    cannot be measured is logged and served by REELBATCH_MAX_BATCH alone. Returns the models measured."""
    have = {e.model for e in kept.load(factory, device=this_device(settings))}
    measured = []
    for model in models:
        if model in have:
            continue
        try:
            measure_and_record(settings, factory, registry.get(model))
        except Exception as exc:  # noqa: BLE001 - a worker that cannot measure still serves, by its max batch
            log.warning("could not measure %s's memory envelope: %s", model, exc)
            continue
        measured.append(model)
    _held.clear()
    return measured
