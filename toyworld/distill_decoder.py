"""Stage 4 of `toy distill` (toyworld.distill runs it after the student): the light decoder
(engine.adapters.light_decoder) trained to return what the toy VAE's decoder returns, on the teacher's final latents,
the student's own, long clips and (optionally) clean clips.

Apart from the student's stages (toyworld.distill_student) because it trains a different network on different
data; what they share (the checkpoints, the export) is in toyworld.distill_train.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from engine.adapters import light_decoder
from toyworld.distill_config import DistillConfig, rng_for
from toyworld.distill_student import student_finals
from toyworld.distill_train import checkpoint_params, resume_params
from toyworld.plumbing import Logger, optimizer_step, warmup_cosine


def train_decoder(pipe, config: DistillConfig, work: Path, logger: Logger, finished: dict) -> dict:
    started, cpu_started = time.monotonic(), time.process_time()
    sources = _decoder_inputs(pipe, config, finished)  # (latents, the VAE's frames, samples a batch) each
    prepare_s, prepare_cpu = time.monotonic() - started, time.process_time() - cpu_started
    vae = pipe.vae.config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        decoder = light_decoder.LightDecoder(light_decoder.DecoderConfig(
            latent_channels=vae.z_dim, spatial_factor=vae.scale_factor_spatial,
            temporal_factor=vae.scale_factor_temporal, channels=tuple(config.decoder_channels),
            blocks=config.decoder_blocks, context=config.decoder_context, latents_mean=tuple(vae.latents_mean),
            latents_std=tuple(vae.latents_std)))
    params = list(decoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.decoder_lr, weight_decay=0.0)
    schedule = warmup_cosine(optimizer, config.decoder_steps, min(config.warmup, config.decoder_steps // 10))
    average = [p.detach().clone() for p in params]
    step, seconds, cpu = resume_params(work / "decoder.last.pt", params, average, optimizer, schedule)
    # Its inputs are made again on a resume; the checkpoint's seconds hold the first making, not this one.
    seconds, cpu = seconds or prepare_s, cpu or prepare_cpu
    started, cpu_started, smoothed = time.monotonic(), time.process_time(), None
    while step < config.decoder_steps:
        rng = rng_for(config, "decoder", step)
        loss = 0.0
        for z, frames, n in sources:
            pick = torch.from_numpy(rng.integers(0, len(z), n))
            loss = loss + decoder_loss(decoder(z[pick]), frames[pick], config)
        optimizer_step(loss, optimizer, params, schedule)
        step += 1
        with torch.no_grad():
            for a, p in zip(average, params):
                a.lerp_(p, 1 - min(0.99, (1 + step) / (10 + step)))
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        if step % config.log_every == 0 or step == config.decoder_steps:
            logger.log(stage="decoder", step=step, of=config.decoder_steps, loss=loss.item(), smoothed=smoothed,
                       seconds=seconds + time.monotonic() - started)
        if step % config.checkpoint_every == 0 and step < config.decoder_steps:
            checkpoint_params(work / "decoder.last.pt", params, average, optimizer, schedule, step,
                        seconds + time.monotonic() - started, cpu + time.process_time() - cpu_started)
    with torch.no_grad():
        for a, p in zip(average, params):
            p.copy_(a)
    return {"decoder": decoder.state_dict(), "decoder_config": decoder.config,
            "seconds": seconds + time.monotonic() - started, "cpu_seconds": cpu + time.process_time() - cpu_started,
            "loss": smoothed}


def decoder_loss(out: torch.Tensor, want: torch.Tensor, config: DistillConfig) -> torch.Tensor:
    """The light decoder's loss against the VAE decoder's frames (B, 3, F, H, W): squared error with the object's
    pixels (far from the clip's median colour, the background) weighing more, since they are all the judge reads and
    a small share of the frame; with `decoder_temporal_weight`, the same on the change from each frame to the
    next, so that what does not move in the VAE's output does not move in the decoder's; and with
    `decoder_colour_weight`, squared error of 4x4 block means over every pixel (the colour term)."""
    background = want.flatten(2).median(dim=2).values[:, :, None, None, None]
    weight = 1.0 + config.decoder_object_weight * ((want - background).abs().amax(1, keepdim=True) > 0.25)
    loss = (weight * (out - want) ** 2).mean() / weight.mean()
    if config.decoder_temporal_weight:
        change = weight[:, :, 1:].maximum(weight[:, :, :-1])  # the object's pixels in either frame
        moved = out.diff(dim=2) - want.diff(dim=2)
        loss = loss + config.decoder_temporal_weight * (change * moved**2).mean() / change.mean()
    if config.decoder_colour_weight:
        loss = loss + config.decoder_colour_weight * (_blocks(out) - _blocks(want)).pow(2).mean()
    return loss


def _blocks(frames: torch.Tensor) -> torch.Tensor:
    """(B, 3, F, H, W) frames -> each frame's 4x4 block means: colour where it lies, without the edges. Every pixel
    weighs the same here, background included, so a tint or blotches over the background cost as much as the
    object's colour."""
    return torch.nn.functional.avg_pool2d(frames.transpose(1, 2).flatten(0, 1), 4)


def _decoder_inputs(pipe, config: DistillConfig, finished: dict) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """What the decoder learns from, as (de-normalised latents, what vae.decode takes; the VAE decoder's frames; how
    many a batch samples): the teacher's final states; the student's own (when `decoder_student_samples`); and world
    clips of 33 frames (a long video's stitch decodes that many); and (when `decoder_clean_clips`) world clips of
    the model's length encoded by the VAE, their clean frames as targets."""
    from toyworld.model import FRAMES, HEIGHT, WIDTH
    from toyworld.plumbing import encode_clips as _encode_clips
    from toyworld.plumbing import to_model_space
    from toyworld.world import dataset

    vae = pipe.vae.config
    view = (1, -1, 1, 1, 1)
    mean, std = torch.tensor(vae.latents_mean).view(view), torch.tensor(vae.latents_std).view(view)
    data = {k: torch.cat([finished["teacher"][k], finished["continuations"][k]]) for k in ("states", "prompts",
                                                                                           "prefix")}
    pick = torch.from_numpy(rng_for(config, "decoder", 10**6).permutation(len(data["states"])))
    teacher_z = data["states"][pick[:config.decoder_teacher_samples], -1] * std + mean
    long_z, _ = _encode_clips(pipe, dataset(config.decoder_long_clips, config.seed + 1, frames=33, width=WIDTH,
                                            height=HEIGHT))
    sources = [(teacher_z, _vae_decode(pipe.vae, teacher_z), config.decoder_batch)]
    if config.decoder_student_samples:
        own = pick[:config.decoder_student_samples]
        student_z = student_finals(pipe, config, finished, {k: v[own] for k, v in data.items()}) * std + mean
        target_z = {"student": student_z, "teacher": data["states"][own, -1] * std + mean}[
            config.decoder_student_target]
        sources.append((student_z, _vae_decode(pipe.vae, target_z), config.decoder_batch))
    sources.append((long_z, _vae_decode(pipe.vae, long_z), max(1, config.decoder_batch // 4)))
    if config.decoder_clean_clips:
        clips = list(dataset(config.decoder_clean_clips, config.seed + 2, frames=FRAMES, width=WIDTH, height=HEIGHT))
        clean_z, _ = _encode_clips(pipe, clips)
        sources.append((clean_z, to_model_space(np.stack([clip for _, clip in clips])), config.decoder_batch))
    return sources


@torch.no_grad()
def _vae_decode(vae, z: torch.Tensor, batch: int = 16) -> torch.Tensor:
    return torch.cat([vae.decode(z[i : i + batch], return_dict=False)[0] for i in range(0, len(z), batch)])
