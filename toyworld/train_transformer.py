"""Stages 4 and 5 of the toy model's training (toyworld.train runs them in order): the transformer, by flow
matching on the encoded latents, then the same transformer fine-tuned to continue a clean prefix as a long video's
next chunk does. Both share one loop, `_flow_matching`.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch

from toyworld.model import FRAMES, HEIGHT, MAX_SEQUENCE_LENGTH, SCHEDULER_SHIFT, TEMPORAL, WIDTH
from toyworld.plumbing import (
    Logger,
    encode_clips,
    optimizer_step,
    resume,
    save_checkpoint,
    stage_rng,
    warmup_cosine,
)
from toyworld.train_config import TrainConfig
from toyworld.world import COMBINATIONS, dataset

# ---- stage 4: the transformer ------------------------------------------------------------------------------------


def prompt_table(pipe) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Every grammar prompt's embedding, and the empty prompt's, as the pipeline itself computes them."""
    prompts = [f"a {c} {s} moving {d} on a {b} background" for c, s, d, b in COMBINATIONS]
    with torch.no_grad():
        embeds = pipe.encode_prompt(prompts, do_classifier_free_guidance=False,
                                    max_sequence_length=MAX_SEQUENCE_LENGTH, device=torch.device("cpu"))[0]
        empty = pipe.encode_prompt([""], do_classifier_free_guidance=False,
                                   max_sequence_length=MAX_SEQUENCE_LENGTH, device=torch.device("cpu"))[0]
    return prompts, embeds, empty


def shifted_sigmas(u: torch.Tensor, shift: float = SCHEDULER_SHIFT) -> torch.Tensor:
    """FlowMatchEulerDiscreteScheduler's static shift, so training sees noise levels as inference visits them."""
    return shift * u / (1 + (shift - 1) * u)


def train_transformer(pipe, config: TrainConfig, work: Path, logger: "Logger", finished: dict) -> dict:
    latents = finished["latents"]["latents"]
    prompts, embeds, empty = prompt_table(pipe)
    prompt_ids = _prompt_ids(prompts, finished["latents"]["prompts"])

    def batch(rng: np.random.Generator):
        pick = torch.from_numpy(rng.integers(0, len(latents), config.batch))
        x0 = latents[pick]
        return x0, _texts(config, rng, embeds[prompt_ids[pick]], empty), torch.zeros(config.batch, dtype=torch.long)

    return _flow_matching(pipe.transformer, config, work, logger, stage="transformer", batch=batch,
                          steps=config.steps, lr=config.lr, warmup=config.warmup, ema=config.ema)


def train_continuation(pipe, config: TrainConfig, work: Path, logger: "Logger", finished: dict) -> dict:
    """Stage 5: windows of longer clips, half of them starting `window - prefix` latents in with a clean prefix."""
    started = time.monotonic()
    window = (FRAMES - 1) // TEMPORAL + 1
    offset = window - config.prefix_latents
    # The encoder reads frames in groups of 4 after the first, so a clip is 4k + 1 frames long.
    frames = 1 + 4 * math.ceil(((offset + window - 1) * TEMPORAL) / 4)
    stats = finished["latents"]
    view = (1, -1, 1, 1, 1)
    mean, std = torch.tensor(stats["latents_mean"]).view(view), torch.tensor(stats["latents_std"]).view(view)
    z, clip_prompts = encode_clips(pipe, dataset(config.continuation_clips, config.seed + 1, frames=frames,
                                                  width=WIDTH, height=HEIGHT))
    latents = (z - mean) / std
    prompts, embeds, empty = prompt_table(pipe)
    prompt_ids = _prompt_ids(prompts, clip_prompts)
    encode_s = time.monotonic() - started

    def batch(rng: np.random.Generator):
        pick = torch.from_numpy(rng.integers(0, len(latents), config.batch))
        continued = torch.from_numpy(rng.random(config.batch) < config.continuation_fraction)
        x0 = torch.stack([latents[i, :, s : s + window]
                          for i, s in zip(pick.tolist(), (continued.long() * offset).tolist())])
        prefix = continued.long() * config.prefix_latents
        return x0, _texts(config, rng, embeds[prompt_ids[pick]], empty), prefix

    state = _flow_matching(pipe.transformer, config, work, logger, stage="continuation", batch=batch,
                           steps=config.continuation_steps, lr=config.continuation_lr,
                           warmup=min(config.warmup, config.continuation_steps // 10), ema=config.continuation_ema,
                           fixed_decay=True)
    state["seconds"] += encode_s
    return state


def _prompt_ids(prompts: list[str], clip_prompts: list[str]) -> torch.Tensor:
    index = {p: i for i, p in enumerate(prompts)}
    return torch.tensor([index[p] for p in clip_prompts])


def _texts(config: TrainConfig, rng: np.random.Generator, text: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """The clips' prompt embeddings, some dropped to the empty prompt's (what guidance's unconditional pass sees)."""
    text = text.clone()
    text[torch.from_numpy(rng.random(len(text)) < config.prompt_dropout)] = empty[0]
    return text


def _flow_matching(model, config: TrainConfig, work: Path, logger: "Logger", *, stage: str, batch, steps: int,
                   lr: float, warmup: int, ema: float, fixed_decay: bool = False) -> dict:
    """The transformer's training loop. `batch(rng)` gives clean latents, text and each clip's number of
    clean prefix latents (0: none); a prefix stays clean, its tokens get timestep 0 and it is outside the loss."""
    from engine.loop.conditioning import tied_tokens

    model.requires_grad_(True).train()
    average = copy.deepcopy(model).requires_grad_(False).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = warmup_cosine(optimizer, steps, warmup)
    step, seconds = resume(work / f"{stage}.last.pt", model, optimizer, schedule, average)
    started, loss_value, smoothed = time.monotonic(), float("nan"), None
    while step < steps:
        rng = stage_rng(config, stage, step)
        generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
        x0, text, prefix = batch(rng)
        noise = torch.randn(x0.shape, generator=generator)
        sigma = shifted_sigmas(torch.rand(len(x0), generator=generator))
        s = sigma.view(-1, 1, 1, 1, 1)
        x_t = (1 - s) * x0 + s * noise
        keep = torch.ones_like(x0)  # 0 on prefix latents: clean in, outside the loss
        for i, n in enumerate(prefix.tolist()):
            x_t[i, :, :n] = x0[i, :, :n]
            keep[i, :, :n] = 0
        if prefix.any():
            clean = tied_tokens(prefix, x0, model.config.patch_size)
            timestep = (sigma * 1000).view(-1, 1).expand(clean.shape).masked_fill(clean, 0)
        else:
            timestep = sigma * 1000
        v = model(x_t, timestep, text, return_dict=False)[0]
        loss = ((v - (noise - x0)) ** 2 * keep).sum() / keep.sum() if prefix.any() \
            else torch.nn.functional.mse_loss(v, noise - x0)
        optimizer_step(loss, optimizer, model.parameters(), schedule)
        step += 1
        decay = ema if fixed_decay else min(ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for a, p in zip(average.parameters(), model.parameters()):
                a.lerp_(p, 1 - decay)
        loss_value = loss.item()
        smoothed = loss_value if smoothed is None else 0.95 * smoothed + 0.05 * loss_value
        if step % config.log_every == 0 or step == steps:
            logger.log(stage=stage, step=step, of=steps, loss=loss_value, smoothed=smoothed,
                       lr=schedule.get_last_lr()[0], seconds=seconds + time.monotonic() - started)
        if step % config.checkpoint_every == 0 and step < steps:
            save_checkpoint(work / f"{stage}.last.pt", model, optimizer, schedule, step,
                        seconds + time.monotonic() - started, average)
    model.load_state_dict(average.state_dict())
    model.requires_grad_(False).eval()
    return {"transformer": model.state_dict(), "seconds": seconds + time.monotonic() - started, "loss": smoothed}
