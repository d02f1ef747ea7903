"""What `reelbatch toy distill` is run with (DistillConfig) and what its stages share to draw: the stages' seeds
(rng_for) and the sigmas the student and the teacher visit. Apart from toyworld.distill, which runs the stages, so
that each stage imports these without importing the runner, and the runner imports the stages at the top."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from toyworld.model import SCHEDULER_SHIFT

# Each stage's index here seeds its random draws ("refine" last so that adding it left the decoder's draws as they
# were); they run in ORDER, the decoder last since it learns from the refined student's own latents too.
STAGES = ("teacher", "continuations", "student", "decoder", "refine", "match")
ORDER = ("teacher", "continuations", "student", "refine", "match", "decoder")
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
    # Stage 6, match (toyworld.distill_match): distribution matching from the refined student, DMD2's gradient
    # (the fake score's estimate against the teacher's guided one, on the student's own samples) weighted by
    # `match_weight` beside the refine stage's landing loss on the teacher's trajectories. 0 steps: none. The
    # shipped student (2026-12-08) has 400: on the validation pairs it took the student's shape from 3.8 points under
    # the teacher to 1.5 (docs/TOY_TRAINING.md, "toy-fast's gap").
    match_steps: int = 400
    match_batch: int = 16
    match_regression_batch: int = 16
    match_lr: float = 5e-5
    match_fake_lr: float = 4e-4
    match_fake_updates: int = 2  # fake-score batches a student step
    match_weight: float = 1.0
    match_ema: float = 0.99
    # Stage 4.
    decoder_channels: tuple[int, ...] = field(default=(32, 16, 8))
    decoder_blocks: int = 1
    # The light decoder's clip-wide causal context (engine.adapters.light_decoder.DecoderConfig.context): without it a
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
    # What the student's latents are decoded to: "student", the VAE's decode of those latents (a copy of the VAE on
    # what the student draws); or "teacher", the VAE's decode of the teacher's final latents from the same noise and
    # prompt, so the decoder also undoes what the student's steps lose against the teacher's (rounded corners).
    # "teacher" served the regression-only student (80.8% shape over 240 validation videos against 78.3%); for the
    # matched student "student" keeps what matching gained (with `toy tune-decoder` after: shape 1.5 points under
    # the teacher on 1200 validation pairs against 1.8, all four 0.4 against 1.6; docs/TOY_TRAINING.md).
    decoder_student_target: str = "student"
    # Weight of the frame-to-frame term: the decoder's change between consecutive frames against the VAE's, which
    # a per-frame loss leaves free (the shimmer the distilled gate's flicker rule measures). 0: none. At 1 the
    # shipped decoder's flicker is 1.01-1.03x the teacher's on 12 held-out draws (the gate allows 1.25x).
    decoder_temporal_weight: float = 1.0
    # Weight of the colour term: each frame's 4x4 block means against the VAE's, every pixel alike. Without it the
    # shipped decoder (2026-12-01) decoded greens as limes and tinted gray backgrounds yellow-green under a red mesh
    # (held-out colour 76.9% against the teacher's 98.8%, clean backgrounds 63.1% against 75.6%); `toy tune-decoder`
    # with it brought them to the figures in docs/TOY_TRAINING.md ("toy-fast's colour").
    decoder_colour_weight: float = 8.0
    # World clips of the model's length, encoded by the VAE, with their clean frames (not the VAE's decode of them)
    # as targets: the VAE rounds a square's corners, and the judge tells a square by them. 0: none. 800 were tried
    # and judged no better on shape (docs/TOY_TRAINING.md, phase 3), so none by default.
    decoder_clean_clips: int = 0
    checkpoint_every: int = 100
    log_every: int = 25


def final_stage(config: DistillConfig) -> str:
    """The stage whose LoRA is the student toy-fast ships (and the decoder learns from): the last that trained."""
    return "match" if config.match_steps else "refine" if config.refine_steps else "student"


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


def rng_for(config: DistillConfig, stage: str, step: int) -> np.random.Generator:
    return np.random.default_rng([config.seed, STAGES.index(stage), step])
