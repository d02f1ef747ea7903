"""Distil the `toy` model into `toy-fast`: a few-step, guidance-free student (a LoRA on the toy transformer) and a
light decoder, on a CPU, resumably.

The method is piecewise trajectory distillation (PeRFlow's piecewise reflow, Yan et al. 2024, on the teacher's own
ODE): the student's sampler visits sigmas s_0 = 1 > s_1 > ... > s_n = 0 (its scheduler's, at its steps) and takes one
Euler step per window, x + (s_{k+1} - s_k) v. The teacher, at its defaults (guidance 2, 20 Euler steps split over
the windows), integrates the ODE from the same noise and records its state at every s_k; the student learns, at
timestep s_k and from the teacher's state there, the velocity that lands on the teacher's next state, with the prompt
alone (one pass, no unconditional one). Windows and stages:

1. teacher: free samples of every prompt, from seeds that are not the quality set's (jobs.quality uses 7000-7079;
   these are drawn from [10^6, 2^31)), in shards of `shard` samples, each saved as it finishes.
2. continuations: the teacher continuing a clean prefix as a long video's next chunk does (engine.loop.conditioning's
clean
   tie: the prefix held clean, timestep 0 on its tokens): the prefix is the last `prefix_latents` of a free teacher
   sample of the same prompt, the rest from new noise.
3. student: a LoRA (peft) on the teacher's transformer, trained on both kinds of trajectory; its prefix latents are
   outside the loss. An exponential moving average of the LoRA weights is what is kept.
5. refine: the student refined from its own states, the loss on where a step lands.
6. match: distribution matching (DMD2's gradient against the teacher's guided score, a fake score following the
   student's samples) beside the landing loss on the teacher's trajectories.
4. decoder (run last): the light decoder (engine.adapters.light_decoder) trained to return what the toy VAE's
   decoder returns, on the teacher's final latents (what renders decode), the student's own (their target the
   teacher's from the same noise) and 33-frame world clips (what a long video's stitch decodes).

Every random draw comes from a generator seeded with (seed, stage, step or shard), so a killed run resumes and draws
what an unbroken run would have. Stages 1 and 2 (the teacher) are in toyworld.distill_teacher, 3 and 5 (the
student) in toyworld.distill_student, 6 in toyworld.distill_match, 4 in toyworld.distill_decoder, what they share and the export in
toyworld.distill_train, and the config, the seeds and the sigmas in toyworld.distill_config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from toyworld.distill_config import ORDER, DistillConfig
from toyworld.distill_decoder import train_decoder
from toyworld.distill_match import train_match
from toyworld.distill_student import train_refine, train_student
from toyworld.distill_teacher import generate_continuations, generate_free
from toyworld.distill_train import export
from toyworld.plumbing import Logger, check_config
from toyworld.world import COMBINATIONS


@dataclass
class Progress:
    seconds: dict[str, float]  # wall seconds per stage, summed over the invocations that ran it
    losses: dict[str, float]
    # CPU seconds per stage (every thread of the process), likewise: what a stage costs whatever else the machine
    # runs, where wall time on a shared machine says as much about the others as about it.
    cpu_seconds: dict[str, float] = field(default_factory=dict)


def distill(config: DistillConfig, teacher_folder: Path, work: Path, out: Path,
            on_log: Callable[[dict], None] | None = None) -> Progress:
    """Run (or resume) every stage in `work`, then write the adapter and the light decoder to `out`."""
    from diffusers import WanPipeline

    if config.continuations and config.samples < len(COMBINATIONS):
        raise ValueError(f"samples must be at least {len(COMBINATIONS)} (one per prompt) for continuations to "
                         f"find a prefix of their prompt, got {config.samples}")
    work.mkdir(parents=True, exist_ok=True)
    check_config(config, work)
    pipe = WanPipeline.from_pretrained(teacher_folder, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    logger = Logger(work / "distill-log.jsonl", on_log)
    progress = Progress(seconds={}, losses={}, cpu_seconds={})
    funcs = {"teacher": generate_free, "continuations": generate_continuations, "student": train_student,
             "decoder": train_decoder, "refine": train_refine, "match": train_match}
    finished: dict[str, dict] = {}
    for stage in ORDER:
        done = work / f"{stage}.done.pt"
        if done.is_file():
            state = torch.load(done, weights_only=False)
        else:
            state = funcs[stage](pipe, config, work, logger, finished)
            torch.save(state, work / f"{stage}.tmp")
            (work / f"{stage}.tmp").replace(done)
        finished[stage] = state
        progress.seconds[stage] = state["seconds"]
        progress.cpu_seconds[stage] = state.get("cpu_seconds", float("nan"))  # nan: a stage run before this was kept
        progress.losses[stage] = state.get("loss", float("nan"))
    export(pipe, config, finished, out)
    return progress
