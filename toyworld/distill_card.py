"""The model card of `toy-fast`, written by `reelbatch toy distill` beside the adapter and the light decoder."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from toyworld.distill import Progress
from toyworld.distill_config import DistillConfig
from toyworld.distill_report import LONG_TARGETS, TARGETS, FastResults


def write_card(path: Path, *, config: DistillConfig, progress: Progress, results: FastResults, machine: str,
               evaluation_s: float, wall_s: float | None) -> None:
    r, g = results, results.gate
    rows = "\n".join(
        f"| {name} | {r.teacher[name]:.1%} | {r.student[name]:.1%} | "
        f"{'>= ' + format(max(TARGETS[name], r.teacher[name] - 0.02), '.1%') if name in TARGETS else ''} |"
        for name in ("colour", "shape", "direction", "background", "all_four", "clean_background"))
    stages = "\n".join(f"| {stage} | {seconds / 60:.1f} | {_minutes(progress.cpu_seconds.get(stage, float('nan')))} | "
                       f"{progress.losses.get(stage, float('nan')):.4f} |" for stage, seconds in progress.seconds.items())
    settings = "\n".join(f"- `{k}`: {v}" for k, v in dataclasses.asdict(config).items())
    total = sum(progress.seconds.values()) / 60
    kept = [v for v in progress.cpu_seconds.values() if v == v]  # nan: a stage run before CPU time was kept
    cpu_total = (f"{sum(kept) / 60:.1f} CPU-minutes over all threads"
                 + ("" if len(kept) == len(progress.cpu_seconds) else " in the stages that kept them"))
    wall = "" if wall_s is None else f", {wall_s / 60:.1f} minutes of wall time for this invocation"
    s = r.seconds
    student_latents = "" if not config.decoder_student_samples else (
        f", and on {config.decoder_student_samples} of the student's own final latents, their target the VAE's decode "
        f"of {'the teacher' if config.decoder_student_target == 'teacher' else 'the student'}'s latents from the same "
        f"noise and prompt")
    context = "; each latent also reads a causal summary of the clip from latent 0 on" if config.decoder_context else ""
    match = "" if not config.match_steps else (
        f", and its samples matched as a whole to the teacher's for {config.match_steps} steps (distribution matching, "
        f"after DMD2: the student renders from fresh noise, and each noised sample moves from where a fake score "
        f"trained on the student's samples puts its clean version toward where the guided teacher puts it), beside "
        f"the landing loss on the teacher's trajectories")
    text = f"""# Model card: `toy-fast`

`toy` distilled into a 4-step, guidance-free student: a LoRA adapter on the `toy` transformer
(`adapter.safetensors`, diffusers' LoRA layout, {r.parameters['adapter']:,} parameters), fused at load, sampled with
diffusers' `FlowMatchEulerDiscreteScheduler` (shift {config.shift:g}, shift_terminal {config.shift_terminal}) at
{config.steps} steps and guidance 1 (one transformer pass a step, no negative prompt), and decoded by a light decoder
(`decoder/`, engine.adapters.light_decoder, {r.parameters['decoder']:,} parameters against the VAE decoder's
{r.parameters['vae_decoder']:,}). The VAE's encoder, the text encoder and the rest are `toy`'s. Registered built in
as `toy-fast` (engine/models/registry.py), teacher `toy`.

Written by `reelbatch toy distill` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d}. Reproduce with:

    reelbatch toy distill --out engine/models/toy-fast --work .toy-distill

## Method

Piecewise trajectory distillation (PeRFlow's piecewise reflow on the teacher's ODE): the teacher (guidance
{config.teacher_guidance:g}, {config.teacher_steps} Euler steps) integrates from noise and its state is kept at each of
the student's sigmas; the student learns, from the teacher's state at a window's start and with the prompt alone, the
velocity that lands on the teacher's state at the window's end. {config.samples} free samples and
{config.continuations} continuations of a clean {config.prefix_latents}-latent prefix (as a long video's next chunk),
from seeds outside the quality set's. It is then refined from its own states ({config.refine_steps} steps, the loss on
where a step lands){match}. The light decoder learns the VAE decoder's output on the teacher's final
latents and on 33-frame world clips{student_latents}{context}. docs/TOY_TRAINING.md
records the variants tried.

## Training

On {machine}: {total:.1f} minutes of stage time ({cpu_total}){wall}, then
{evaluation_s / 60:.1f} minutes for the evaluation below.

| stage | minutes | CPU-minutes | last loss |
|---|---|---|---|
{stages}

Settings:
{settings}

## Evaluation

{g.count} prompt/seed pairs held out ({g.sample}): every toy prompt in turn, seeds drawn afresh from [2^32, 2^40),
outside every seed training, distillation and the choice between candidates used (jobs.quality.sample), rendered at
each model's defaults and judged from pixels after H.264 encoding and decoding. The target is the issue's (colour,
direction, background >= 95%, shape >= 80%) and no attribute, nor the share of clean backgrounds (no tint or
blotches, toyworld.judge), more than 2 points below the teacher's.

| attribute | teacher `toy` (20 steps, guidance 2) | `toy-fast` ({config.steps} steps, guidance 1) | target |
|---|---|---|---|
{rows}

Distilled gate (engine.levers.gate_rules.judge_distilled):
{'passed' if g.passed else 'failed: ' + '; '.join(g.failures)}. Flicker (mean change between frames, uint8 levels)
{g.flicker:.2f} against the teacher's {g.teacher_flicker:.2f}; blank frames {g.blank_frames} (teacher
{g.teacher_blank_frames}). PSNR against the teacher's renders of the same seeds, reported, not required (another model
draws other pixels from the same noise): mean {g.psnr_db_mean:.1f} dB, minimum {g.psnr_db_min:.1f} dB.

Long videos: {r.long['videos']} videos of 4 s (33 frames, 5 chunks, each held to the clean end of the one before),
{r.long['windows']} windows of 9 frames judged after H.264: colour kept in {r.long['colour']:.1%} (target
>= {LONG_TARGETS['colour']:.0%}), direction in {r.long['direction']:.1%} (target >= {LONG_TARGETS['direction']:.0%}).

Seconds per video on this machine, one run (batches of 8): teacher render {s['teacher_render']:.3f}, `toy-fast`
render {s['student_render']:.3f}; decoding alone {s['vae_decode'] * 1000:.1f} ms with the VAE's decoder and
{s['light_decode'] * 1000:.1f} ms with the light one. Side-by-side speed is `reelbatch bench`'s to measure.

Meets the targets: {'yes' if r.meets_targets else 'no'}.

## Limits

- Only the toy grammar, at 32x32 and 9-frame windows, as `toy`.
- A distilled model is refused by the engine until its gate against the teacher is recorded for its files as they
  are (`reelbatch toy distill` records it in the cache folder it ran with).
"""
    path.write_text(text, encoding="utf-8")


def _minutes(seconds: float) -> str:
    return "not kept" if seconds != seconds else f"{seconds / 60:.1f}"
