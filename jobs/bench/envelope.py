"""`reelbatch bench envelope`: a model's memory envelope on this device, measured, fitted and checked on shapes the
fit never saw (jobs.render.envelopes measures; engine.models.envelope fits), and kept for workers and submit."""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.envelope import Envelope, Point
from engine.models.registry import ModelInfo
from engine.models.shape_rules import rules_of
from jobs.bench.presets import PRESETS
from jobs.bench.sides import bench_model, built
from jobs.db import envelopes as kept
from jobs.db.connect import session_factory
from jobs.errors import UsageError
from jobs.render.envelopes import default_frames, envelope_of, measure, measured_with, plan
from jobs.settings import Settings


@dataclass(frozen=True)
class Held:
    point: Point
    predicted: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: above 0 the line is on the safe side."""
        return (self.predicted - self.point.peak_bytes) / self.point.peak_bytes


@dataclass(frozen=True)
class EnvelopeBench:
    envelope: Envelope
    fitted: list[Point]
    held: list[Held]
    failed: list[str]  # sizes that ran out of memory
    recorded: bool

    @property
    def worst(self) -> float:
        return max((abs(h.error) for h in self.held), default=0.0)

    def largest(self) -> list[tuple[Point, int]]:
        e = self.envelope
        return [(p, e.largest_batch(p.tokens, p.width, p.height)) for p in [*self.fitted, *(h.point for h in self.held)]
                if p.batch == 1]

    def to_dict(self) -> dict:
        return {"envelope": self.envelope.to_dict(), "fitted": [vars(p) for p in self.fitted],
                "held_out": [{**vars(h.point), "predicted_bytes": h.predicted, "error": h.error} for h in self.held],
                "worst_held_out_error": self.worst, "failed": self.failed, "recorded": self.recorded,
                "largest_batch": [{"width": p.width, "height": p.height, "frames": p.frames, "batch": n}
                                  for p, n in self.largest()]}


def model_info(settings: Settings, model: str | None, preset: str | None) -> ModelInfo:
    """A registered model, or a bench preset's model (jobs.bench.models, built into the cache on first use)."""
    if (model is None) == (preset is None):
        raise UsageError("bench envelope: give --model NAME (a registered model) or --preset NAME (its bench model)")
    if preset is not None:
        if preset not in PRESETS:
            raise UsageError(f"--preset: {preset!r} is not a preset (presets: {', '.join(PRESETS)})")
        return bench_model(PRESETS[preset], settings.engine.cache_dir)
    registry = settings.registry()
    if model not in registry:
        raise UsageError(f"--model: {model!r} is not registered (registered: {', '.join(registry.names())})")
    return built(registry.get(model), settings.engine.cache_dir)


def run_envelope(settings: Settings, info: ModelInfo, width: int | None = None, height: int | None = None,
                 frames: int | None = None, record: bool = True) -> EnvelopeBench:
    """Measure the plan around (width, height, frames) (default: the model's own shape), fit on its first part, check
    the line on the held-out part, and with `record` keep the envelope for this device."""
    width, height = width or info.defaults.width, height or info.defaults.height
    frames = frames or default_frames(info)
    rules = rules_of(info)
    for side, n in (("width", width), ("height", height)):
        problem = rules.side_problem(info.name, side, n, info.spatial_multiple)
        if problem is not None:
            raise UsageError(f"--resolution: {side} {n} {problem}")
    fitted_sizes, held_sizes = (
        [s for s in sizes if not any(rules.side_problem(info.name, side, n, info.spatial_multiple)
                                     for side, n in (("width", s.width), ("height", s.height)))
         and rules.window_problem(info.name, s.frames) is None]
        for sizes in plan(info, width, height, frames))
    device, memory, resident, points = measure(settings, info, fitted_sizes + held_sizes)
    fitted = [p for p in points[:len(fitted_sizes)] if isinstance(p, Point)]
    failed = [p for p in points if isinstance(p, str)]
    if not fitted:
        raise UsageError(f"bench envelope: no fitted size of {info.name} fits this device: {'; '.join(failed)}")
    envelope = envelope_of(info, device, memory, resident, fitted)
    held = [Held(p, envelope.predict(p.batch, p.tokens, p.width, p.height))
            for p in points[len(fitted_sizes):] if isinstance(p, Point)]
    if record:
        kept.record(session_factory(settings.database_url), envelope, fitted, measured_with(info))
    return EnvelopeBench(envelope, fitted, held, failed, record)

