"""The evidence behind engine.frames.video_checks' structure and denoised limits (docs/QUALITY.md, "Checks on every
video"): N renders of each built-in model, normal and broken as tests/engine/broken.py breaks them, from seed SEED0
on; prints each set's range of noise_kept and structure and how many videos the checks flag or the engine fails.

    PYTHONPATH=. python scripts/measure_broken.py N SEED0 [MODEL ...]   # toy, toy-fast, toy-i2v, tiny by default
"""

import sys
from pathlib import Path

from engine.engine import Engine
from engine.frames.video_checks import check_video
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.types import RenderBatch, RenderRequest, Shape
from tests.engine.broken import KINDS, broken
from toyworld.world import COMBINATIONS


def main() -> None:
    n, seed0 = int(sys.argv[1]), int(sys.argv[2])
    registry = Registry()
    models = sys.argv[3:] or [m for m in ("toy", "toy-fast", "toy-i2v", "tiny") if m in registry.models]
    engine = Engine(EngineConfig(cache_dir=Path("/tmp/reelbatch-measure-broken")), registry, measuring=models)
    for model in models:
        info = registry.get(model)
        d = info.defaults
        shape = Shape(model, d.width, d.height, info.valid_frames(round(d.fps * d.duration_s)), d.steps, d.guidance)
        requests = tuple(RenderRequest(i, "a {} {} moving {} on a {} background".format(*COMBINATIONS[(seed0 + i) % 80]),
                                       None, seed0 + i) for i in range(n))
        for kind in (None, *KINDS):
            if kind is None:
                videos = engine.render(RenderBatch(shape, requests))
            else:
                with broken(engine.pipeline(model), kind, engine.light_decoder(model)):
                    videos = engine.render(RenderBatch(shape, requests))
            failed = sum(v.error is not None for v in videos)
            checks = [check_video(v.frames, info.checks, None, v.noise_kept) for v in videos if v.frames is not None]
            flagged = sum(not c.passed for c in checks)
            kept = [v.noise_kept for v in videos if v.noise_kept is not None and v.error is None]
            structure = [c.structure.value for c in checks if c.structure is not None]
            span = (lambda v: f"{min(v):.3f}-{max(v):.3f}" if v else "-")
            print(f"{model:9s} {kind or 'normal':14s} kept {span(kept):13s} structure {span(structure):13s} "
                  f"flagged {flagged} failed {failed} of {n}", flush=True)


if __name__ == "__main__":
    main()
