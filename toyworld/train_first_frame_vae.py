"""`toy-i2v`'s VAE: `toy`'s with its encoder fine-tuned, so a picture training never drew comes back as frame 0.

A `toy-i2v` video's frame 0 is the VAE's decode of the picture's encoded latent (engine.loop.first_frame; Wan's VAE
is causal, so latent 0 alone makes frame 0): its PSNR against the picture is the VAE round trip's, less what H.264
takes. `toy`'s VAE was trained on toyworld.world's clips only (five exact colours, 16-18 px, whole-pixel positions,
hard edges); on pictures beyond that (toyworld.pictures: other sizes, sub-pixel positions, anti-aliased edges, other
shades; the unseen validation set of jobs.quality.images) frame 0 read 23.8 dB against the picture on average, and
a 10-px blue disc on black came back red, a 21-px light green one yellow.

This stage fine-tunes the encoder alone, the decoder frozen (gradients pass through it): every latent the
transformer makes decodes exactly as before, so videos from prompts alone and every frame the transformer draws
are `toy`'s decoder's, and only the picture's latent moves. Each batch mixes pictures drawn beyond training's
sampling (`unseen_fraction`, broader than the judged unseen sets: toyworld.pictures with `sizes` and `delta_e`)
with first frames of world clips as `toy` was trained on. The loss is the decode's squared error against the
picture (PSNR's own measure), plus `anchor_weight` times the squared distance of the world frames' latents from the
old encoder's (per channel, in units of the latents' std): the transformer was trained on those latents, so
in-distribution pictures keep giving it what it knows. A full fine-tune (decoder too) went further on pictures but
decoded the transformer's latents in other colours (docs/TOY_TRAINING.md, "toy-i2v's VAE").

Draws come from (seed, stage, step) as in toyworld.train, in training's seed range; the stage checkpoints, so a
killed run resumes. The VAE is written to `out`/vae in diffusers' layout; `toy-i2v` loads it over `toy`'s.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from toyworld.model import HEIGHT, TOY_SEED, WIDTH
from toyworld.pictures import render_picture, sample_picture
from toyworld.plumbing import (
    Logger,
    Progress,
    check_config,
    optimizer_step,
    record_replaced,
    resume,
    save_checkpoint,
    stage_rng,
    to_model_space,
    warmup_cosine,
)
from toyworld.train import decode_unclamped
from toyworld.world import render_clip, sample_spec

STAGE = "first_frame_vae"


@dataclass(frozen=True)
class FirstFrameVaeConfig:
    seed: int = TOY_SEED
    steps: int = 1200
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 20
    # Share of each batch drawn by toyworld.pictures; the rest are first frames of toyworld.world clips.
    unseen_fraction: float = 0.5
    # Training's pictures: sizes as shares of the shorter side (8-24 px at 32x32) and shades up to 14 CIELAB from
    # the palette colour, around the judged unseen sets' (jobs.quality.images: 9.6-15 and 18.9-22.1 px, 3-10).
    sizes: tuple[float, float] = (0.25, 0.75)
    delta_e: tuple[float, float] = (0.0, 14.0)
    anchor_weight: float = 0.1
    # Weigh each picture's squared error by its inverse (its gradient then is that of log MSE, of PSNR itself),
    # scaled by the batch's mean so the anchor keeps its weight: a mean PSNR counts each picture's decibels alike.
    # On the validation set it gave 25.9 dB against plain MSE's 25.6 (docs/TOY_TRAINING.md, "toy-i2v's VAE").
    psnr_loss: bool = True
    checkpoint_every: int = 100
    log_every: int = 25


def train_first_frame_vae(config: FirstFrameVaeConfig, base: Path, work: Path, out: Path,
                          on_log: Callable[[dict], None] | None = None) -> Progress:
    """Fine-tune the encoder of the VAE in `base`/vae (resuming in `work`); write the VAE to `out`/vae."""
    from diffusers import AutoencoderKLWan

    work.mkdir(parents=True, exist_ok=True)
    check_config(config, work)
    vae = AutoencoderKLWan.from_pretrained(base / "vae", use_safetensors=True)
    logger = Logger(work / "train-log.jsonl", on_log)
    done = work / f"{STAGE}.done.pt"
    if done.is_file():
        state = torch.load(done, weights_only=False)
        vae.load_state_dict(state["vae"])
    else:
        state = _stage(vae, config, work, logger)
        torch.save(state, work / f"{STAGE}.tmp")
        (work / f"{STAGE}.tmp").replace(done)
        (work / f"{STAGE}.last.pt").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    vae.save_pretrained(out / "vae", safe_serialization=True)
    record_replaced(out)
    return Progress(seconds={STAGE: state["seconds"]}, losses={STAGE: state["loss"]})


def batch(config: FirstFrameVaeConfig, step: int) -> torch.Tensor:
    """Step `step`'s pictures as one-frame videos (B, 3, 1, H, W) in [-1, 1]: the unseen ones first, then the world
    frames (the anchor's)."""
    rng = stage_rng(config, STAGE, step)
    unseen = round(config.batch * config.unseen_fraction)
    short = min(WIDTH, HEIGHT)
    sizes = ((config.sizes[0] * short, config.sizes[1] * short),)
    pictures = [render_picture(sample_picture(rng, width=WIDTH, height=HEIGHT, sizes=sizes, delta_e=config.delta_e),
                               width=WIDTH, height=HEIGHT) for _ in range(unseen)]
    pictures += [render_clip(sample_spec(rng, width=WIDTH, height=HEIGHT), frames=1, width=WIDTH, height=HEIGHT)[0]
                 for _ in range(config.batch - unseen)]
    return to_model_space(np.stack(pictures)[:, None])


def _stage(vae, config: FirstFrameVaeConfig, work: Path, logger: Logger) -> dict:
    old = copy.deepcopy(vae).eval().requires_grad_(False)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    vae.requires_grad_(False)
    params = list(vae.encoder.parameters()) + list(vae.quant_conv.parameters())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    schedule = warmup_cosine(optimizer, config.steps, min(config.warmup, config.steps // 10))
    step, seconds = resume(work / f"{STAGE}.last.pt", vae, optimizer, schedule)
    vae.train()
    unseen = round(config.batch * config.unseen_fraction)
    started, losses = time.monotonic(), []
    while step < config.steps:
        x = batch(config, step)
        mean, _ = vae._encode(x).chunk(2, dim=1)  # the posterior's mode, as first_frame_latents takes it
        errors = ((decode_unclamped(vae, mean) - x) ** 2).mean(dim=(1, 2, 3, 4))
        mse = errors.mean()
        fit = (errors / errors.detach()).mean() * mse.detach() if config.psnr_loss else mse
        with torch.no_grad():
            kept, _ = old._encode(x[unseen:]).chunk(2, dim=1)
        anchor = (((mean[unseen:] - kept) / std) ** 2).mean()
        optimizer_step(fit + config.anchor_weight * anchor, optimizer, params, schedule)
        step += 1
        losses.append((mse.item(), anchor.item()))
        if step % config.log_every == 0 or step == config.steps:
            recent = np.mean(losses[-config.log_every:], axis=0)
            logger.log(stage=STAGE, step=step, of=config.steps, loss=float(recent[0]), anchor=float(recent[1]),
                       seconds=seconds + time.monotonic() - started)
        if step % config.checkpoint_every == 0 and step < config.steps:
            save_checkpoint(work / f"{STAGE}.last.pt", vae, optimizer, schedule, step,
                            seconds + time.monotonic() - started)
    vae.eval()
    loss = float(np.mean([m for m, _ in losses[-config.log_every:]])) if losses else float("nan")
    return {"vae": vae.state_dict(), "seconds": seconds + time.monotonic() - started, "loss": loss}
