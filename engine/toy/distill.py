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
2. continuations: the teacher continuing a clean prefix as a long video's next chunk does (engine.denoise's clean
   tie: the prefix held clean, timestep 0 on its tokens): the prefix is the last `prefix_latents` of a free teacher
   sample of the same prompt, the rest from new noise.
3. student: a LoRA (peft) on the teacher's transformer, trained on both kinds of trajectory; its prefix latents are
   outside the loss. An exponential moving average of the LoRA weights is what is kept.
4. decoder: the light decoder (engine.light_decoder) trained to return what the toy VAE's decoder returns, on the
   teacher's final latents (what renders decode) and on 33-frame world clips (what a long video's stitch decodes).

Every random draw comes from a generator seeded with (seed, stage, step or shard), so a killed run resumes and draws
what an unbroken run would have. Stages 1 and 2 (the teacher) are in engine.toy.distill_teacher, 3 and 5 (the
student) in engine.toy.distill_student, 4 in engine.toy.distill_decoder, and what they share and the export in
engine.toy.distill_train.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from engine.toy.model import SCHEDULER_SHIFT
from engine.toy.plumbing import Logger, check_config
from engine.toy.world import COMBINATIONS

# Each stage's index here seeds its random draws ("refine" last so that adding it left the decoder's draws as they
# were); they run in ORDER, the decoder last since it learns from the refined student's own latents too.
STAGES = ("teacher", "continuations", "student", "decoder", "refine")
ORDER = ("teacher", "continuations", "student", "refine", "decoder")
# jobs.quality.SEED_BASE .. + SAMPLE_SIZE: never drawn here (that would be training on the quality set's noise).
QUALITY_SEEDS = range(7000, 7080)


@dataclass(frozen=True)
class DistillConfig:
    seed: int = 20261217
    # The student's sampler (registered with toy-fast): diffusers' FlowMatchEulerDiscreteScheduler at `steps`.
    steps: int = 4
    shift: float = SCHEDULER_SHIFT
    shift_terminal: float | None = 0.1
    # The teacher at its registered defaults.
    teacher_steps: int = 20
    teacher_guidance: float = 2.0
    samples: int = 800  # free teacher samples (10 per prompt)
    continuations: int = 400
    prefix_latents: int = 2  # the toy registration's chunk_overlap
    shard: int = 160
    generate_batch: int = 32
    # Stage 3.
    rank: int = 32
    student_steps: int = 1000
    student_batch: int = 32
    student_lr: float = 1e-3
    warmup: int = 50
    ema: float = 0.995
    # Stage 5, refine: from the student, this share of a batch started from the student's own state at its window
    # (its earlier windows run without gradient from the teacher's noise) rather than the teacher's, the target still
    # the teacher's next state; and the loss on where the step lands (the velocity's error times the window's length,
    # normalised over the batch) rather than on the velocity, so each window weighs as much as it moves the sample
    # and the long window where the shape is decided (0.64 -> 0.1) is not outweighed by the short early ones.
    refine_steps: int = 300
    refine_lr: float = 3e-4
    rollout_fraction: float = 0.5
    landing_loss: bool = True
    # Stage 4.
    decoder_channels: tuple[int, ...] = field(default=(32, 16, 8))
    decoder_blocks: int = 1
    # The light decoder's clip-wide causal context (engine.light_decoder.DecoderConfig.context): without it a
    # one-latent memory decoded 2-4 of 80 red objects blue; with it 1 video's colour of 320 was missed, one the
    # VAE's decoder misses too (docs/TOY_TRAINING.md, phase 3).
    decoder_context: bool = True
    decoder_steps: int = 800
    decoder_batch: int = 8
    decoder_lr: float = 3e-3
    decoder_teacher_samples: int = 1600  # final teacher latents decoded by the VAE as targets
    decoder_long_clips: int = 160  # 33-frame world clips
    decoder_object_weight: float = 8.0
    # The student's own final latents (its 4 steps from the teacher's noise), decoded by the VAE as targets: what
    # the light decoder decodes in every toy-fast render, and where decoders trained on the teacher's alone turned
    # some reds blue. 0: none. 800 of the 1200 (all 1200 judged no better, docs/TOY_TRAINING.md phase 3).
    decoder_student_samples: int = 800
    # What the student's latents are decoded to: "student", the VAE's decode of those latents (a plain copy of the
    # VAE); or "teacher", the VAE's decode of the teacher's final latents from the same noise and prompt, so the
    # decoder also undoes what the student's 4 steps lose against the teacher's 20 (rounded corners).
    # "teacher" shipped: 80.8% shape over 240 validation videos, the teacher's own figure, against 78.3% for
    # "student" (docs/TOY_TRAINING.md, phase 3).
    decoder_student_target: str = "teacher"
    # Weight of the frame-to-frame term: the decoder's change between consecutive frames against the VAE's, which
    # a per-frame loss leaves free (the shimmer the distilled gate's flicker rule measures). 0: none. At 1 the
    # shipped decoder's flicker is 1.06-1.10x the teacher's (the gate allows 1.25x).
    decoder_temporal_weight: float = 1.0
    # World clips of the model's length, encoded by the VAE, with their clean frames (not the VAE's decode of them)
    # as targets: the VAE rounds a square's corners, and the judge tells a square by them. 0: none. 800 were tried
    # and judged no better on shape (docs/TOY_TRAINING.md, phase 3), so none by default.
    decoder_clean_clips: int = 0
    checkpoint_every: int = 100
    log_every: int = 25


@dataclass
class Progress:
    seconds: dict[str, float]  # wall seconds per stage, summed over the invocations that ran it
    losses: dict[str, float]
    # CPU seconds per stage (every thread of the process), likewise: what a stage costs whatever else the machine
    # runs, where wall time on a shared machine says as much about the others as about it.
    cpu_seconds: dict[str, float] = field(default_factory=dict)


def student_sigmas(config: DistillConfig) -> torch.Tensor:
    """The sigmas the student's sampler visits, with the final 0: what toy-fast's scheduler gives at its steps."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=config.shift, shift_terminal=config.shift_terminal)
    scheduler.set_timesteps(config.steps)
    return scheduler.sigmas.clone()


def teacher_sigmas(config: DistillConfig, windows: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """The teacher's Euler sigmas: `teacher_steps` in all, spread over the student's windows in proportion to their
    length in the teacher's unshifted time (where its own 20-step schedule is uniform); and the index of each window
    boundary in them."""
    shift = SCHEDULER_SHIFT
    u = windows / (shift - (shift - 1) * windows)  # inverse of the shift
    lengths = (u[:-1] - u[1:]).numpy()
    counts = np.maximum(1, np.round(lengths / lengths.sum() * config.teacher_steps)).astype(int)
    counts[np.argmax(counts)] += config.teacher_steps - counts.sum()
    parts, bounds = [], [0]
    for k, n in enumerate(counts):
        parts.append(torch.linspace(float(u[k]), float(u[k + 1]), int(n) + 1)[:-1])
        bounds.append(bounds[-1] + int(n))
    fine = torch.cat(parts + [u[-1:]])
    return shift * fine / (1 + (shift - 1) * fine), bounds


def distill(config: DistillConfig, teacher_folder: Path, work: Path, out: Path,
            on_log: Callable[[dict], None] | None = None) -> Progress:
    """Run (or resume) every stage in `work`, then write the adapter and the light decoder to `out`."""
    from diffusers import WanPipeline

    # Here, not at the top: these modules import DistillConfig and rng_for from this one.
    from engine.toy.distill_decoder import train_decoder
    from engine.toy.distill_student import train_refine, train_student
    from engine.toy.distill_teacher import generate_continuations, generate_free
    from engine.toy.distill_train import export

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
             "decoder": train_decoder, "refine": train_refine}
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


# ---- plumbing -----------------------------------------------------------------------------------------------------


def rng_for(config: DistillConfig, stage: str, step: int) -> np.random.Generator:
    return np.random.default_rng([config.seed, STAGES.index(stage), step])
