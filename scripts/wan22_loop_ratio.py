"""The engine's loop against diffusers' on Wan 2.2's two architectures at real widths and reduced depth, on this
machine, in one process: for each model the same two videos (prompt embeddings, seeds, shape) are denoised by
`WanPipeline.__call__(output_type="latent")`, by engine.loop.denoise in exact mode and by engine.loop.denoise with
guidance batched, in turn, ROUNDS times (the order rotating each round), and the fastest and the median seconds of each
are compared, in wall seconds and in this process's CPU seconds (both threads): on a shared machine the fastest run is
the one least slowed by others, and CPU seconds count the work done rather than the waiting (the load average is
recorded).

    PYTHONPATH=$PWD python scripts/wan22_loop_ratio.py [ROUNDS]     # prints one JSON object

Not `reelbatch bench` (which also times text, decode, encode and storage through the job system): its presets
a14b-cpu and ti2v-cpu run these architectures and shapes that way (docs/SPEED.md, docs/PERFORMANCE.md). Denoising
only, which is what the loop changes, with the sides interleaved so a change of load falls on all of them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from engine.loop import denoise
from engine.loop.guidance import Guidance
from jobs.bench.models import build_wan22_a14b_widths_cpu, build_wan22_ti2v_widths_cpu

# (builder, width, height, frames, steps, guidance, guidance_2): 192 tokens a video for both (3 latent frames of
# 8x8 patches). At 4 steps the A14B's UniPC timesteps (flow shift 3) are 999, 900 (high-noise expert) and 750, 500
# (low-noise): two steps on each.
CASES = {
    "a14b-widths (5120 wide, 1 block per expert, 128x128, 9 frames, 4 steps)":
        (build_wan22_a14b_widths_cpu, 128, 128, 9, 4, 4.0, 3.0),
    "ti2v-widths (3072 wide, 2 blocks, 256x256, 9 frames, 4 steps)":
        (build_wan22_ti2v_widths_cpu, 256, 256, 9, 4, 5.0, None),
}
PROMPTS = ("a red sports car at sunrise", "a golden retriever in the rain")


def measure(build, width: int, height: int, frames: int, steps: int, guidance: float, guidance_2: float | None,
            rounds: int) -> dict:
    """One model: the three sides in turn, `rounds` times, after one untimed call (allocator, thread pools)."""
    pipe = build()
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        embeds = pipe.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False, max_sequence_length=512)[0]
        negative = pipe.encode_prompt([""] * 2, do_classifier_free_guidance=False, max_sequence_length=512)[0]

    def generators():
        return [torch.Generator().manual_seed(1000 + i) for i in range(len(PROMPTS))]

    def engine(batched: bool):
        return denoise.denoise(pipe, prompt_embeds=embeds, negative_prompt_embeds=negative, height=height,
                               width=width, frames=frames, steps=steps, generators=generators(),
                               guidance=Guidance(guidance, guidance_2, batched=batched))

    sides = {
        "diffusers": lambda: pipe(prompt_embeds=embeds, negative_prompt_embeds=negative, height=height, width=width,
                                  num_frames=frames, num_inference_steps=steps, guidance_scale=guidance,
                                  guidance_scale_2=guidance_2, generator=generators(), output_type="latent").frames,
        "engine_exact": lambda: engine(batched=False),
        "engine_batched": lambda: engine(batched=True),
    }
    seconds = {side: [] for side in sides}
    cpu = {side: [] for side in sides}
    out = {}
    order = list(sides)
    with torch.inference_mode():
        sides["diffusers"]()
        for r in range(rounds):
            for side in order[r % 3:] + order[: r % 3]:
                start, start_cpu = time.perf_counter(), time.process_time()
                out[side] = sides[side]()
                seconds[side].append(time.perf_counter() - start)
                cpu[side].append(time.process_time() - start_cpu)

    def summary(runs: dict[str, list[float]]) -> dict:
        fastest = {side: min(s) for side, s in runs.items()}
        median = {side: statistics.median(s) for side, s in runs.items()}
        return {"runs": runs, "min": fastest, "median": median,
                "diffusers_over_engine_exact": {"min": fastest["diffusers"] / fastest["engine_exact"],
                                                "median": median["diffusers"] / median["engine_exact"]},
                "diffusers_over_engine_batched": {"min": fastest["diffusers"] / fastest["engine_batched"],
                                                  "median": median["diffusers"] / median["engine_batched"]}}

    return {
        "wall_s": summary(seconds),
        "cpu_s": summary(cpu),
        "exact_bit_identical": torch.equal(out["diffusers"], out["engine_exact"]),
        "batched_max_abs_diff": float((out["diffusers"] - out["engine_batched"]).abs().max()),
        "latent_shape": list(out["diffusers"].shape),
    }


def main(rounds: int) -> dict:
    load_before = os.getloadavg()
    models = {name: measure(*case, rounds=rounds) for name, case in CASES.items()}
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "rounds": rounds,
            "load_average_before_after": [load_before, os.getloadavg()], "models": models}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=1))
