"""Stages 3 and 4 of `toy distill` (engine.toy.distill runs them in order): the student LoRA on the teacher's
trajectories and the light decoder on the VAE decoder's output; then the export of both."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from engine import light_decoder
from engine.toy.distill import DistillConfig, rng_for
from engine.toy.plumbing import Logger

ADAPTER_FILE = "adapter.safetensors"
DECODER_FOLDER = "decoder"
# Every linear layer of the transformer: attention, feed-forward, the timestep and text embedders, the output.
# The timestep's modulation (condition_embedder.time_proj) is where a few-step student differs most from its
# teacher; the cross-attention is where a guidance-free one must read the prompt harder.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2", "linear_1", "linear_2",
                "time_proj", "proj_out")


# ---- stage 3: the student -----------------------------------------------------------------------------------------


def add_lora(transformer, rank: int) -> list[torch.nn.Parameter]:
    """A LoRA (alpha = rank, so scale 1) on every target layer, its B zero: the student starts as the teacher."""
    from peft import LoraConfig

    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, init_lora_weights=True,
                                       target_modules=list(LORA_TARGETS)))
    return [p for n, p in transformer.named_parameters() if "lora_" in n]


def train_student(pipe, config: DistillConfig, work: Path, logger: Logger, finished: dict) -> dict:
    """Stage 3: from the teacher (LoRA B at zero), on the teacher's states, the loss on the velocity."""
    return _train_lora(pipe, config, work, logger, finished, stage="student", steps=config.student_steps,
                       lr=config.student_lr, rollout=0.0, landing=False, start=None)


def train_refine(pipe, config: DistillConfig, work: Path, logger: Logger, finished: dict) -> dict:
    """Stage 5: the student refined from its own states (a `rollout_fraction` of each batch starts where the
    student's earlier steps put it, the target still the teacher's next state), the loss on where a step lands."""
    return _train_lora(pipe, config, work, logger, finished, stage="refine", steps=config.refine_steps,
                       lr=config.refine_lr, rollout=config.rollout_fraction, landing=config.landing_loss,
                       start=finished["student"]["lora"])


def _train_lora(pipe, config: DistillConfig, work: Path, logger: Logger, finished: dict, *, stage: str, steps: int,
                lr: float, rollout: float, landing: bool, start: dict | None) -> dict:
    from peft.utils import set_peft_model_state_dict

    from engine.denoise import tied_tokens
    from engine.toy.train_transformer import prompt_table

    _, embeds, _ = prompt_table(pipe)
    data = {k: torch.cat([finished["teacher"][k], finished["continuations"][k]]) for k in ("states", "prompts",
                                                                                           "prefix")}
    sigmas = finished["teacher"]["sigmas"]
    windows = len(sigmas) - 1
    model = pipe.transformer
    model.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):  # PEFT draws lora_A from torch's global generator
        torch.manual_seed(config.seed)
        params = add_lora(model, config.rank)
    if start is not None:
        set_peft_model_state_dict(model, start)
    for p in params:
        p.requires_grad_(True)
    average = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = _warmup_cosine(optimizer, steps, min(config.warmup, steps // 10))
    step, seconds, cpu = _resume(work / f"{stage}.last.pt", params, average, optimizer, schedule)
    patch = model.config.patch_size
    started, cpu_started, smoothed = time.monotonic(), time.process_time(), None

    def velocity(x, k, text, prefix):
        """The student's velocity at each sample's window k (B,), in one forward: a timestep per sample, or per
        token with 0 on a continuation's clean prefix, as engine.denoise's clean tie gives it."""
        t = sigmas[k] * 1000
        if prefix.any():
            clean = tied_tokens(prefix, x, patch)
            return model(x, t[:, None].expand(clean.shape).masked_fill(clean, 0), text, return_dict=False)[0]
        return model(x, t, text, return_dict=False)[0]

    while step < steps:
        rng = rng_for(config, stage, step)
        pick = torch.from_numpy(rng.integers(0, len(data["states"]), config.student_batch))
        k = torch.from_numpy(rng.integers(0, windows, config.student_batch))
        states, prefix, text = data["states"][pick], data["prefix"][pick], embeds[data["prompts"][pick]]
        x = states[torch.arange(len(pick)), k].clone()
        target = states[torch.arange(len(pick)), k + 1]
        own = torch.from_numpy(rng.random(len(pick)) < rollout) & (k > 0)
        if own.any():
            x[own] = _rollout(velocity, states[own, 0], k[own], text[own], prefix[own], sigmas)
        v = velocity(x, k, text, prefix)
        length = (sigmas[k + 1] - sigmas[k]).view(-1, 1, 1, 1, 1)
        wanted = (target - x) / length
        keep = _keep_mask(x, prefix)
        if landing:
            keep = keep * length**2 / (length**2).mean()
        loss = (((v - wanted) ** 2) * keep).sum() / _keep_mask(x, prefix).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        decay = min(config.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for a, p in zip(average, params):
                a.lerp_(p, 1 - decay)
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        if step % config.log_every == 0 or step == steps:
            logger.log(stage=stage, step=step, of=steps, loss=loss.item(), smoothed=smoothed,
                       lr=schedule.get_last_lr()[0], seconds=seconds + time.monotonic() - started)
        if step % config.checkpoint_every == 0 and step < steps:
            _checkpoint(work / f"{stage}.last.pt", params, average, optimizer, schedule, step,
                        seconds + time.monotonic() - started, cpu + time.process_time() - cpu_started)
    with torch.no_grad():
        for a, p in zip(average, params):
            p.copy_(a)
    model.requires_grad_(False).eval()
    from peft.utils import get_peft_model_state_dict

    lora = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    model.delete_adapters(["default"])  # the transformer is the teacher again for the stages after
    return {"lora": lora, "seconds": seconds + time.monotonic() - started,
            "cpu_seconds": cpu + time.process_time() - cpu_started, "loss": smoothed}


@torch.no_grad()
def _rollout(velocity, noise, k, text, prefix, sigmas) -> torch.Tensor:
    """Each sample's own state at its window k: the student's Euler steps from the teacher's noise."""
    x = noise.clone()
    for window in range(int(k.max())):
        rows = k > window
        at = torch.full((int(rows.sum()),), window)
        v = velocity(x[rows], at, text[rows], prefix[rows])
        x[rows] = x[rows] + (sigmas[window + 1] - sigmas[window]) * v
    return x


def _keep_mask(x: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """1 on latents in the loss, 0 on a continuation's clean prefix."""
    keep = torch.ones_like(x[:, :1])
    for i, n in enumerate(prefix.tolist()):
        keep[i, :, :n] = 0
    return keep.expand_as(x)


# ---- stage 4: the light decoder -----------------------------------------------------------------------------------


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
    schedule = _warmup_cosine(optimizer, config.decoder_steps, min(config.warmup, config.decoder_steps // 10))
    average = [p.detach().clone() for p in params]
    step, seconds, cpu = _resume(work / "decoder.last.pt", params, average, optimizer, schedule)
    # Its inputs are made again on a resume; the checkpoint's seconds hold the first making, not this one.
    seconds, cpu = seconds or prepare_s, cpu or prepare_cpu
    started, cpu_started, smoothed = time.monotonic(), time.process_time(), None
    while step < config.decoder_steps:
        rng = rng_for(config, "decoder", step)
        loss = 0.0
        for z, frames, n in sources:
            pick = torch.from_numpy(rng.integers(0, len(z), n))
            loss = loss + decoder_loss(decoder(z[pick]), frames[pick], config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        with torch.no_grad():
            for a, p in zip(average, params):
                a.lerp_(p, 1 - min(0.99, (1 + step) / (10 + step)))
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        if step % config.log_every == 0 or step == config.decoder_steps:
            logger.log(stage="decoder", step=step, of=config.decoder_steps, loss=loss.item(), smoothed=smoothed,
                       seconds=seconds + time.monotonic() - started)
        if step % config.checkpoint_every == 0 and step < config.decoder_steps:
            _checkpoint(work / "decoder.last.pt", params, average, optimizer, schedule, step,
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
    a small share of the frame; and, with `decoder_temporal_weight`, the same on the change from each frame to the
    next, so that what does not move in the VAE's output does not move in the decoder's."""
    background = want.flatten(2).median(dim=2).values[:, :, None, None, None]
    weight = 1.0 + config.decoder_object_weight * ((want - background).abs().amax(1, keepdim=True) > 0.25)
    loss = (weight * (out - want) ** 2).mean() / weight.mean()
    if config.decoder_temporal_weight:
        change = weight[:, :, 1:].maximum(weight[:, :, :-1])  # the object's pixels in either frame
        moved = out.diff(dim=2) - want.diff(dim=2)
        loss = loss + config.decoder_temporal_weight * (change * moved**2).mean() / change.mean()
    return loss


def _decoder_inputs(pipe, config: DistillConfig, finished: dict) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """What the decoder learns from, as (de-normalised latents, what vae.decode takes; the VAE decoder's frames; how
    many a batch samples): the teacher's final states; the student's own (when `decoder_student_samples`); and world
    clips of 33 frames (a long video's stitch decodes that many); and (when `decoder_clean_clips`) world clips of
    the model's length encoded by the VAE, their clean frames as targets."""
    from engine.toy.model import FRAMES, HEIGHT, WIDTH
    from engine.toy.plumbing import encode_clips as _encode_clips
    from engine.toy.plumbing import to_model_space
    from engine.toy.world import dataset

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
def student_finals(pipe, config: DistillConfig, finished: dict, data: dict, batch: int = 32) -> torch.Tensor:
    """The student's final latents (normalised, as its sampler ends) from the teacher's noise of `data`: its Euler
    steps at its sigmas with the prompt alone, a continuation's prefix held clean with timestep 0 on its tokens, as
    the engine renders toy-fast."""
    from peft.utils import set_peft_model_state_dict

    from engine.denoise import tied_tokens
    from engine.toy.train_transformer import prompt_table

    _, embeds, _ = prompt_table(pipe)
    student = finished["refine"] if config.refine_steps else finished["student"]
    sigmas = finished["teacher"]["sigmas"]
    model = pipe.transformer
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        add_lora(model, config.rank)
    set_peft_model_state_dict(model, student["lora"])
    model.eval()
    finals = []
    for b in range(0, len(data["states"]), batch):
        start, prefix = data["states"][b : b + batch, 0], data["prefix"][b : b + batch]
        text = embeds[data["prompts"][b : b + batch]]
        keep = _keep_mask(start, prefix).bool()
        clean = tied_tokens(prefix, start, model.config.patch_size)
        x = start.clone()
        for k in range(len(sigmas) - 1):
            t = sigmas[k] * 1000
            t = t.expand(clean.shape).masked_fill(clean, 0) if prefix.any() else t.expand(len(x))
            v = model(x, t, text, return_dict=False)[0]
            x = torch.where(keep, x + (sigmas[k + 1] - sigmas[k]) * v, start)
        finals.append(x)
    model.delete_adapters(["default"])
    return torch.cat(finals)


@torch.no_grad()
def _vae_decode(vae, z: torch.Tensor, batch: int = 16) -> torch.Tensor:
    return torch.cat([vae.decode(z[i : i + batch], return_dict=False)[0] for i in range(0, len(z), batch)])


# ---- export -------------------------------------------------------------------------------------------------------


def export(pipe, config: DistillConfig, finished: dict, out: Path) -> None:
    """The adapter in diffusers' LoRA layout (keys `transformer.<module>.lora_A.weight`, as Wan LoRAs are published)
    and the light decoder folder."""
    from diffusers import WanPipeline

    out.mkdir(parents=True, exist_ok=True)
    student = finished["refine"] if config.refine_steps else finished["student"]
    WanPipeline.save_lora_weights(out, transformer_lora_layers=student["lora"], weight_name=ADAPTER_FILE,
                                  safe_serialization=True)
    decoder = light_decoder.LightDecoder(finished["decoder"]["decoder_config"])
    decoder.load_state_dict(finished["decoder"]["decoder"])
    light_decoder.save(decoder, out / DECODER_FOLDER)


# ---- plumbing -----------------------------------------------------------------------------------------------------


def _warmup_cosine(optimizer, total: int, warmup: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _checkpoint(path: Path, params, average, optimizer, schedule, step: int, seconds: float, cpu: float) -> None:
    state = {"params": [p.detach().clone() for p in params], "average": [a.clone() for a in average],
             "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "step": step, "seconds": seconds,
             "cpu_seconds": cpu}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _resume(path: Path, params, average, optimizer, schedule) -> tuple[int, float, float]:
    """The step, wall and CPU seconds a checkpoint reached (all 0 without one), its weights and optimizer loaded."""
    if not path.is_file():
        return 0, 0.0, 0.0
    state = torch.load(path, weights_only=False)
    with torch.no_grad():
        for p, saved in zip(params, state["params"]):
            p.copy_(saved)
        for a, saved in zip(average, state["average"]):
            a.copy_(saved)
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    return state["step"], state["seconds"], state.get("cpu_seconds", 0.0)

