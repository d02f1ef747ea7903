"""What a quality gate renders: its sample of videos, each with its own shape, prompt and seed.

- `--prompts FILE`: a manifest (YAML or JSONL, read by jobs.manifest, so a mistake is FILE:LINE: field: ...) whose
  videos, at their own sizes, steps and seeds, are the sample: the user's own prompts on the user's own model.
- Otherwise a model trained on the toy world renders a held-out draw (jobs.quality.sample.held_out_set): `count`
  toy prompts with seeds drawn afresh, outside every seed its training and model choice used, its entropy in the
  label so the draw can be rendered again.
- Any other model renders the shipped set, PROMPTS (36 prompts of people, animals, landscapes, cities, objects,
  close-ups and styles, fixed seeds) at the registration's defaults.

The toy judge (toyworld.judge) reads prompt adherence only where the model and every prompt are the toy world's
(a toy-world model given a manifest of other prompts is judged on fidelity alone); elsewhere a
gate asks fidelity (same-trajectory levers) or reference-free measures and a CLIP score (distilled ones).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from engine.models.registry import TOY_WEIGHTS, ModelInfo, Registry
from engine.types import Shape
from jobs.errors import UsageError
from jobs.manifest import load_manifest
from jobs.manifest.specs import derive_seed
from jobs.quality.evaluate import native_shape, render_cases, round_trip
from jobs.quality.sample import Case, held_out_set, new_entropy
from toyworld.world import parse_prompt

PROMPTS = Path(__file__).resolve().parent / "prompts.jsonl"
TOY_HELD_OUT, SHIPPED = "toy held-out draw", "shipped prompts"


@dataclass(frozen=True)
class Item:
    shape: Shape
    case: Case
    fps: int


@dataclass(frozen=True)
class GateSample:
    label: str  # "toy held-out draw, entropy N", SHIPPED, or the manifest's path
    items: tuple[Item, ...]
    judged: bool  # whether the toy judge reads these prompts

    def __len__(self) -> int:
        return len(self.items)

    def for_model(self, info: ModelInfo) -> GateSample:
        """The same videos rendered by `info` (a teacher): its model name, steps and guidance, their sizes."""
        d = info.defaults
        return replace(self, items=tuple(replace(i, shape=replace(i.shape, model=info.name, steps=d.steps,
                                                                  guidance=d.guidance)) for i in self.items))


def toy_world(registry: Registry, model: str) -> bool:
    """Whether `model` was trained on the toy world: its folder (or base) is the shipped toy model's, or it is
    distilled from such a model."""
    info = registry.get(model)
    folders = [p.resolve() for p in (info.path, info.base) if p is not None]
    if TOY_WEIGHTS.resolve() in folders:
        return True
    return info.teacher is not None and info.teacher in registry and toy_world(registry, info.teacher)


def gate_sample(registry: Registry, model: str, *, prompts: Path | None, count: int,
                entropy: int | None = None) -> GateSample:
    """The sample a gate of `model` renders. `entropy` seeds a toy-world draw (default: fresh)."""
    shape, fps = native_shape(registry, model)  # a usage error for an unregistered name
    if prompts is not None:
        sample = manifest_sample(registry, model, prompts, judged=False)
        # The toy judge reads a toy-world model's renders of prompts in its grammar; any other prompt, it cannot.
        judged = toy_world(registry, model) and all(parse_prompt(i.case.prompt) for i in sample.items)
        return replace(sample, judged=judged)
    if toy_world(registry, model):
        entropy = new_entropy() if entropy is None else entropy
        return GateSample(f"{TOY_HELD_OUT}, entropy {entropy}",
                          tuple(Item(shape, c, fps) for c in held_out_set(count, entropy)), judged=True)
    sample = manifest_sample(registry, model, PROMPTS, judged=False)
    return replace(sample, label=SHIPPED)


def manifest_sample(registry: Registry, model: str, path: Path, *, judged: bool) -> GateSample:
    """Every video of the manifest at `path`, rendered by `model` at its own size, frames, steps and guidance, with
    its seed (or the seed a run of that name would derive). A video longer than the model's window or starting from
    a picture is refused by its line: a gate measures what one pass renders from text."""
    spec = load_manifest(path, registry=registry, model=model)
    items, problems = [], []
    for v in spec.videos:
        if v.chunks > 1 or v.image is not None:
            problems.append(f"{path}:{v.line}: video {v.id!r}: a gate's sample renders one window from text; this "
                            f"video {'starts from a picture' if v.image else f'needs {v.chunks} chunks'}")
            continue
        seed = v.seed if v.seed is not None else derive_seed(spec.name, v.id)
        items.append(Item(Shape(model, v.width, v.height, v.frames, v.steps, v.guidance), Case(v.prompt, seed), v.fps))
    if problems:
        raise UsageError("\n".join(problems))
    return GateSample(str(path), tuple(items), judged=judged)


def render_sample(engine, sample: GateSample, batch: int) -> list:
    """Raw uint8 frames of every video of `sample`, in its order: same-shape videos rendered together in batches of
    up to `batch` (jobs.quality.evaluate.render_cases)."""
    by_shape: dict[Shape, list[int]] = {}
    for index, item in enumerate(sample.items):
        by_shape.setdefault(item.shape, []).append(index)
    videos: list = [None] * len(sample.items)
    for shape, indexes in by_shape.items():
        for index, video in zip(indexes, render_cases(engine, shape, [sample.items[i].case for i in indexes], batch)):
            videos[index] = video
    return videos


def judged_adherence(sample: GateSample, videos: list) -> dict[str, float]:
    """The toy judge's adherence per attribute after the MP4 round trip, or {} where it cannot read the prompts."""
    return judged(sample, videos)[0]


def judged(sample: GateSample, videos: list) -> tuple[dict[str, float], list[bool]]:
    """judged_adherence, and per video whether the judge read every attribute right ([] where it cannot read the
    prompts)."""
    if not sample.judged:
        return {}, []
    from toyworld.judge import score

    scores = score((item.case.prompt, round_trip(video, item.fps)) for item, video in zip(sample.items, videos))
    return ({name: getattr(scores, name)
             for name in ("colour", "shape", "direction", "background", "all_four", "clean_background")},
            list(scores.right))
