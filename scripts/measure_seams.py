"""The evidence behind engine.frames.video_checks' seam_jump limit (docs/QUALITY.md, "Seams"): N long videos of each
model (FRAMES frames, chunked as its registration says) from seed SEED0 on; prints each video's seam jump (its largest
step across a seam over its median step) and seam score, and the range. MODEL:noised renders with the re-noised
chunk tie instead of the registration's (on `toy` the object jumps back at every seam: the seams the check is for).

    PYTHONPATH=. python scripts/measure_seams.py N SEED0 FRAMES [MODEL[:TIE] ...]   # toy, toy-fast by default
"""

import sys
from dataclasses import replace
from pathlib import Path

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.types import RenderRequest, Shape
from toyworld.world import COMBINATIONS


def main() -> None:
    n, seed0, frames = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    registry = Registry()
    asked = sys.argv[4:] or ["toy", "toy-fast"]
    models = [a.split(":")[0] for a in asked]
    for a in asked:
        if ":" in a:
            model, tie = a.split(":")
            registry.models[model] = replace(registry.get(model), chunk_condition=tie)
    engine = Engine(EngineConfig(cache_dir=Path("/tmp/reelbatch-measure-seams")), registry, measuring=models)
    for model, label in zip(models, asked):
        info = registry.get(model)
        d = info.defaults
        window = Shape(model, d.width, d.height, info.max_frames, d.steps, d.guidance)
        jumps = []
        for i in range(n):
            prompt = "a {} {} moving {} on a {} background".format(*COMBINATIONS[(seed0 + i) % 80])
            video, _ = engine.render_long(window, RenderRequest(i, prompt, None, seed0 + i),
                                          info.chunk_plan(info.valid_frames(frames)))
            jumps.append(video.seam_jump)
            print(f"{label:14s} seed {seed0 + i} jump {video.seam_jump:.2f} seam score {video.seam_score:.2f} "
                  f"{prompt}", flush=True)
        print(f"{label:14s} seeds {seed0}-{seed0 + n - 1}: jump {min(jumps):.2f}-{max(jumps):.2f}, "
              f"over 3: {sum(j > 3 for j in jumps)} of {n}", flush=True)


if __name__ == "__main__":
    main()
