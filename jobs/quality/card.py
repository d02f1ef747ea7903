"""After `reelbatch toy train`: judge the new weights, store their reference renders, and write the model card."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.engine import Engine
from engine.models.registry import TINY, TOY, Registry
from jobs.quality.evaluate import (
    REFERENCES,
    QualityReport,
    evaluate,
    native_shape,
    render_cases,
    round_trip,
    save_references,
)
from jobs.quality.sample import SAMPLE_SIZE, sample_set
from jobs.settings import Settings
from toyworld.judge import score
from toyworld.plumbing import to_model_space
from toyworld.world import parse_prompt, render_clip, sample_spec


@dataclass
class ToyResults:
    vae: dict[str, float]  # adherence of the VAE's own reconstructions of world clips
    quality: QualityReport  # adherence of generated videos, at the model's defaults
    parameters: dict[str, int]


def evaluate_toy(settings: Settings, folder: Path, count: int = SAMPLE_SIZE) -> ToyResults:
    """Render the first `count` cases of the sample set with the weights in `folder` in exact mode and save those
    frames as its references, then run the quality check against them with the configured engine (a second render,
    so it also measures how far the engine's optimisations move the output)."""
    registry = Registry({"tiny": TINY, "toy": dataclasses.replace(TOY, path=folder)})
    shape, fps = native_shape(registry, "toy")
    cases = sample_set(count)
    # References come from exact mode: diffusers' own arithmetic, every lossless-in-intent optimisation off.
    exact = Engine(settings.engine_config().exact(), registry)
    save_references(folder / REFERENCES, shape, cases, render_cases(exact, shape, cases, batch=8))
    engine = Engine(settings.engine_config(), registry)
    quality = evaluate(engine, shape, cases, fps=fps, references=folder / REFERENCES)
    pipe = engine.pipeline("toy")
    parameters = {name: sum(p.numel() for p in getattr(pipe, name).parameters())
                  for name in ("vae", "transformer", "text_encoder")}
    return ToyResults(vae=vae_adherence(pipe.vae, shape, fps, count), quality=quality, parameters=parameters)


def vae_adherence(vae, shape, fps: int, count: int = SAMPLE_SIZE) -> dict[str, float]:
    """Encode and decode world clips of the sample set's first `count` cases (as the pipeline decodes: clamped), then
    judge the MP4s."""
    pairs = []
    for case in sample_set(count):
        spec = sample_spec(case.seed, width=shape.width, height=shape.height, **parse_prompt(case.prompt))
        pairs.append((case.prompt, render_clip(spec, frames=shape.frames, width=shape.width, height=shape.height)))
    judged = []
    with torch.no_grad():
        for start in range(0, len(pairs), 16):
            chunk = pairs[start : start + 16]
            latents = vae.encode(to_model_space(np.stack([c for _, c in chunk]))).latent_dist.mode()
            video = vae.decode(latents).sample  # (B, 3, F, H, W) in [-1, 1]
            frames = ((video.permute(0, 2, 3, 4, 1).numpy() + 1) * 127.5).round().clip(0, 255).astype(np.uint8)
            judged += [(prompt, round_trip(f, fps)) for (prompt, _), f in zip(chunk, frames)]
    scores = score(judged)
    return {name: getattr(scores, name) for name in ("colour", "shape", "direction", "background", "all_four")}


def write_card(path: Path, *, config, progress, results: ToyResults, machine: str, evaluation_s: float) -> None:
    q = results.quality
    ref = q.reference
    rows = "\n".join(
        f"| {name} | {results.vae[name]:.1%} | {q.adherence[name]:.1%} | "
        f"{'>= ' + format(q.targets[name], '.0%') if name in q.targets else ''} |"
        for name in ("colour", "shape", "direction", "background", "all_four")
    )
    stages = "\n".join(f"| {stage} | {seconds / 60:.1f} | {progress.losses.get(stage, float('nan')):.4f} |"
                       for stage, seconds in progress.seconds.items())
    settings = "\n".join(f"- `{k}`: {v}" for k, v in dataclasses.asdict(config).items())
    s = q.shape
    text = f"""# Model card: `toy`

A text-to-video model of diffusers' Wan architecture (`WanPipeline`: `AutoencoderKLWan`, `WanTransformer3DModel`, a
UMT5 text encoder, `FlowMatchEulerDiscreteScheduler`), trained from scratch on this project's procedural toy world
(`toyworld/world.py`): prompts like "a red circle moving left on a black background", 80 in all. It exists so
that renders can be judged (`reelbatch quality`); it knows nothing outside that grammar.

Written by `reelbatch toy train` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d}. Reproduce with:

    reelbatch toy train --out engine/models/toy --work .toy-train

## Architecture

- VAE: 4x spatial and 2x temporal compression, 8 latent channels, base width 16 ({results.parameters['vae']:,}
  parameters). Latent statistics of the training set are in its config (`latents_mean`, `latents_std`).
- Transformer: 4 layers, 4 heads of 32, 2x2 patches, 80 tokens for a 9-frame 32x32 clip
  ({results.parameters['transformer']:,} parameters); the saved weights are an exponential moving average.
- Text encoder: UMT5 with random weights from the seed below, never trained, over a byte-level tokenizer
  ({results.parameters['text_encoder']:,} parameters); prompts are padded to 64 tokens.
- Native shape (the defaults a manifest inherits): {s['width']}x{s['height']}, {s['frames']} frames at {s['fps']} fps,
  {s['steps']} steps, guidance {s['guidance']:g}.

## Training

On {machine}: {sum(progress.seconds.values()) / 60:.1f} minutes of training (the stages below; a resumed run counts
each stage's own time), then {evaluation_s / 60:.1f} minutes for the evaluation below.

| stage | minutes | last loss |
|---|---|---|
{stages}

Settings:
{settings}

## Evaluation

{q.count} prompt/seed pairs (the first {q.count} of `jobs/quality/sample.py`'s sample set, whose 80 hold each prompt
once and any 16 in a row every attribute value), judged from pixels after
H.264 encoding and decoding (`toyworld/judge.py`). "VAE" is the autoencoder's reconstruction of clips drawn by the
world; "generated" is the full pipeline from the prompt, at the native shape above.

| attribute | VAE | generated | target |
|---|---|---|---|
{rows}

Generated videos meet the targets: {'yes' if q.meets_targets else 'no'}. The sample set rendered in exact mode
(diffusers' own denoising loop) is stored as `references.npz`; the engine's default mode (guidance batched) rendered
the set again here and came within a minimum PSNR of {ref.get('psnr_db_min', float('nan')):.1f} dB (mean
{ref.get('psnr_db_mean', float('nan')):.1f}; 100 is the cap for identical frames) and a minimum SSIM of
{ref.get('ssim_min', float('nan')):.4f}.

## Limits

- Only the toy grammar: other prompts give some shape of some colour moving somewhere.
- Trained at 32x32 and 9 frames; other sizes and longer clips are untested (long videos are made in chunks).
- Shape (circle or square) is the weakest attribute: the two differ only in their corners.
"""
    path.write_text(text, encoding="utf-8")
