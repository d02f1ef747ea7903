"""The evidence behind engine.frames.video_checks' seam_jump limit (docs/QUALITY.md, "Seams") and the long-video seam
figures of docs/LONG_VIDEOS.md: N long videos of each model (FRAMES frames, chunked as its registration says); prints
each video's seam jump (its largest step across a seam over its median step) and seam score, and the range.
MODEL:noised renders with the re-noised chunk tie instead of the registration's (on `toy` the object jumps back at
every seam: the seams the check is for).

    PYTHONPATH=. python scripts/measure_seams.py N SEED0 FRAMES [MODEL[:TIE] ...]   # toy, toy-fast by default

Seeds SEED0 .. SEED0 + N - 1, for seed s the prompt toyworld.world.COMBINATIONS[s mod 80]. With `--held-out ENTROPY` the N
cases are instead jobs.quality.sample.held_out_set(SEED0 + N, ENTROPY)[SEED0:] (seeds drawn from [2^32, 2^40), which
nothing was trained or chosen on; SEED0 is then the index of the first case). `--judge` also judges each 9-frame
window (every 6 frames) of the H.264 round trip on colour and direction, and tracks the object
(toyworld.judge.object_steps): how often its step into a seam's first frame is over 3x the video's median step,
against the steps between latent frames inside the chunks and those within a latent frame. `--json FILE` writes
every video's figures.
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.types import RenderRequest, Shape
from jobs.quality.sample import held_out_set
from toyworld.world import COMBINATIONS

# An object step this many times the video's median step is a jump (the seam_jump check's limit, on the object).
JUMP = 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=int)
    parser.add_argument("seed0", type=int)
    parser.add_argument("frames", type=int)
    parser.add_argument("models", nargs="*", default=["toy", "toy-fast"])
    parser.add_argument("--held-out", type=int, metavar="ENTROPY")
    parser.add_argument("--judge", action="store_true")
    parser.add_argument("--json", type=Path, metavar="FILE")
    args = parser.parse_args()
    registry = Registry()
    models = [a.split(":")[0] for a in args.models]
    registered = {m: registry.get(m) for m in models}
    if args.held_out is None:
        cases = [("a {} {} moving {} on a {} background".format(*COMBINATIONS[(args.seed0 + i) % 80]), args.seed0 + i)
                 for i in range(args.n)]
    else:
        cases = [(c.prompt, c.seed) for c in held_out_set(args.seed0 + args.n, args.held_out)[args.seed0:]]
    engine = Engine(EngineConfig(cache_dir=Path("/tmp/reelbatch-measure-seams")), registry, measuring=models)
    out = []
    for model, label in zip(models, args.models):
        # The registration's tie, or the one the label names (toy and toy:noised side by side).
        tie = label.split(":")[1] if ":" in label else registered[model].chunk_condition
        info = registry.models[model] = replace(registered[model], chunk_condition=tie)
        d = info.defaults
        window = Shape(model, d.width, d.height, info.max_frames, d.steps, d.guidance)
        plan = info.chunk_plan(info.valid_frames(args.frames))
        rows = []
        for i, (prompt, seed) in enumerate(cases):
            video, _ = engine.render_long(window, RenderRequest(i, prompt, None, seed), plan)
            row = {"model": label, "frames": plan.frames, "seed": seed, "prompt": prompt,
                   "seam_jump": round(video.seam_jump, 4), "seam_score": round(video.seam_score, 4)}
            if args.judge:
                row |= judged(video.frames, prompt, plan.seams(), d.fps)
            rows.append(row)
            extra = (f" colour {row['colour']}/{row['windows']} direction {row['direction']}/{row['windows']} "
                     f"object seam step {_ratio(row['object_seam'])}" if args.judge else "")
            print(f"{label:14s} seed {seed} jump {video.seam_jump:.2f} seam score {video.seam_score:.2f}{extra} "
                  f"{prompt}", flush=True)
        jumps = [r["seam_jump"] for r in rows]
        print(f"{label:14s} {len(rows)} videos of {plan.frames} frames ({plan.chunks} chunks): jump "
              f"{min(jumps):.2f}-{max(jumps):.2f}, over 3: {sum(j > 3 for j in jumps)} of {len(rows)}", flush=True)
        if args.judge:
            summary(label, rows)
        out += rows
    if args.json:  # one video a line
        args.json.write_text("[\n" + ",\n".join(json.dumps(r) for r in out) + "\n]\n")


def judged(frames: np.ndarray, prompt: str, seams: list[int], fps: int) -> dict:
    """Colour and direction per 9-frame window of the H.264 round trip, and the object's steps over its median step:
    the largest into a seam's first frame, and how many steps of each kind are over JUMP (None: no object found)."""
    from jobs.quality.evaluate import round_trip
    from toyworld.judge import judge_clip, object_steps

    seen = round_trip(frames, fps)
    windows = [judge_clip(seen[s:s + 9]).matches(prompt) for s in range(0, len(frames) - 8, 6)]
    row = {"windows": len(windows), "colour": sum(w["colour"] for w in windows),
           "direction": sum(w["direction"] for w in windows),
           "colour_by_window": [int(w["colour"]) for w in windows],
           "direction_by_window": [int(w["direction"]) for w in windows]}
    try:
        step = np.linalg.norm(object_steps(frames), axis=1)
    except ValueError:
        return row | {"object_seam": None, "object_steps": None}
    ratio = step / np.median(step)
    # Step i joins frames i and i + 1. A seam's is the step into its first frame; the first chunk's own steps (before
    # the first seam) have no seam to compare with and are left out. Latent j >= 1 holds frames 2j - 1 and 2j
    # (temporal factor 2), so an even i steps from one latent frame to the next, as a seam's step does.
    kinds = {"seam": [s - 1 for s in seams],
             "between_latents": [i for i in range(seams[0], len(step)) if i % 2 == 0 and i + 1 not in seams],
             "within_latent": [i for i in range(seams[0], len(step)) if i % 2 == 1]}
    return row | {"object_seam": round(float(ratio[kinds["seam"]].max()), 4),
                  "object_steps": {k: [int((ratio[v] > JUMP).sum()), len(v)] for k, v in kinds.items()}}


def summary(label: str, rows: list[dict]) -> None:
    w = sum(r["windows"] for r in rows)
    tracked = [r for r in rows if r["object_seam"] is not None]
    print(f"{label:14s} colour {sum(r['colour'] for r in rows)} of {w} windows, direction "
          f"{sum(r['direction'] for r in rows)} of {w}; object tracked in {len(tracked)} of {len(rows)}: seam step over "
          f"{JUMP:g}x its median in {sum(r['object_seam'] > JUMP for r in tracked)} videos (largest "
          f"{max(r['object_seam'] for r in tracked):.2f}x)", flush=True)
    for kind in ("seam", "between_latents", "within_latent"):
        over = sum(r["object_steps"][kind][0] for r in tracked)
        steps = sum(r["object_steps"][kind][1] for r in tracked)
        print(f"{label:14s}   object steps over {JUMP:g}x the median, {kind}: {over} of {steps} "
              f"({100 * over / steps:.1f}%)", flush=True)


def _ratio(value: float | None) -> str:
    return "lost" if value is None else f"{value:.2f}x"


if __name__ == "__main__":
    main()
