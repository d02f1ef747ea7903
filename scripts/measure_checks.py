"""The evidence behind engine.frames.video_checks' default limits (docs/QUALITY.md, "Checks on every video"): the checks
of 80 renders each of `toy` and `toy-fast` (every prompt of the toy world once, seeds 31000-31079: neither the quality
set's 7000-7079 nor training's) and of 80 videos of each kind made bad on purpose, drawn by the toy world from the
same prompts: all black; frozen after the second frame; per-frame uniform noise; the object still where the prompt
moves it, without and with +-4 levels of grain; and the world's own moving clips.

    PYTHONPATH=. python scripts/measure_checks.py [N] [OUT.json] [MODEL ...]   # MODEL: toy and toy-fast by default

Writes every video's values to OUT.json and prints each set's distribution and how many each limit flags.
"""

import json
import sys
import time

import numpy as np

from engine.engine import Engine
from engine.frames.video_checks import DEFAULT_THRESHOLDS, check_video
from engine.models.registry import Registry
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.settings import Settings
from toyworld.world import COMBINATIONS, ClipSpec, render_clip, sample_spec

SEED0 = 31_000


def values(frames: np.ndarray) -> dict[str, float]:
    return {c.name: c.value for c in check_video(frames).all()}


def renders(engine: Engine, model: str, n: int) -> list[dict]:
    d = engine.registry.get(model).defaults
    shape = Shape(model, d.width, d.height, 9, d.steps, d.guidance)
    out = []
    for start in range(0, n, 16):
        requests = tuple(RenderRequest(i, "a {} {} moving {} on a {} background".format(*COMBINATIONS[i % 80]), None,
                                       SEED0 + i) for i in range(start, min(n, start + 16)))
        out += [values(v.frames) for v in engine.render(RenderBatch(shape, requests))]
    return out


def bad(n: int) -> dict[str, list[dict]]:
    rng = np.random.default_rng(5)
    sets: dict[str, list[dict]] = {k: [] for k in ("black", "frozen", "noise", "still", "still_grain", "world")}
    for i in range(n):
        c = COMBINATIONS[i % 80]
        spec = sample_spec(rng, width=32, height=32, colour=c[0], shape=c[1], direction=c[2], background=c[3])
        clip = render_clip(spec, frames=9, width=32, height=32)
        frozen = clip.copy()
        frozen[2:] = frozen[1]
        still = render_clip(ClipSpec(*[getattr(spec, f) for f in ("colour", "shape", "direction", "background",
                                                                   "size", "x", "y")], 0),
                            frames=9, width=32, height=32)
        grain = np.clip(still.astype(np.int16) + rng.integers(-4, 5, still.shape), 0, 255).astype(np.uint8)
        for name, video in (("black", np.zeros_like(clip)), ("frozen", frozen),
                            ("noise", rng.integers(0, 256, clip.shape, dtype=np.uint8)), ("still", still),
                            ("still_grain", grain), ("world", clip)):
            sets[name].append(values(video))
    return sets


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    models = sys.argv[3:] or ["toy", "toy-fast"]
    engine = Engine(Settings.from_env({}).engine_config(), Registry(), measuring=models)  # whatever their gates
    sets = {}
    for model in models:
        start = time.perf_counter()
        sets[model] = renders(engine, model, n)
        print(f"{model}: {n} renders in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    sets.update({f"bad:{k}": v for k, v in bad(n).items()})
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(sets, f)
    t = DEFAULT_THRESHOLDS
    limits = {"blank": (t.max_blank, 1), "frozen": (t.max_frozen, 1), "flicker": (t.max_flicker, 1),
              "motion": (t.min_motion, -1)}
    for name, rows in sets.items():
        print(name)
        for check, (limit, sign) in limits.items():
            v = np.array([r[check] for r in rows])
            flagged = int(((v - limit) * sign > 0).sum())
            print(f"  {check:8s} min {v.min():7.3f} p50 {np.median(v):7.3f} max {v.max():7.3f}  flagged {flagged}")
        print(f"  any flagged: {sum(not check_ok(r, limits) for r in rows)} of {len(rows)}")


def check_ok(r: dict, limits: dict) -> bool:
    return all((r[check] - limit) * sign <= 0 for check, (limit, sign) in limits.items())


if __name__ == "__main__":
    main()
