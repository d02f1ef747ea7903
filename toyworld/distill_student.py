"""Stages 3 and 5 of `toy distill` (toyworld.distill runs them in order): the student, a LoRA on the teacher's
transformer trained on the teacher's trajectories (3) and then refined from its own states (5); and the student's
own final latents, which the light decoder (toyworld.distill_decoder) also learns from.

Apart from the decoder's stage because the two train different things on different data; what they share (the
checkpoints, the export) is in toyworld.distill_train.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from toyworld.distill_config import DistillConfig, final_stage, rng_for
from toyworld.distill_train import checkpoint_params, resume_params
from toyworld.plumbing import Logger, optimizer_step, warmup_cosine

# Every linear layer of the transformer: attention, feed-forward, the timestep and text embedders, the output.
# The timestep's modulation (condition_embedder.time_proj) is where a few-step student differs most from its
# teacher; the cross-attention is where a guidance-free one must read the prompt harder.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2", "linear_1", "linear_2",
                "time_proj", "proj_out")


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

    from toyworld.train_transformer import prompt_table

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
    schedule = warmup_cosine(optimizer, steps, min(config.warmup, steps // 10))
    step, seconds, cpu = resume_params(work / f"{stage}.last.pt", params, average, optimizer, schedule)
    started, cpu_started, smoothed = time.monotonic(), time.process_time(), None

    velocity = student_velocity(model, sigmas)

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
        if landing:
            loss = landing_loss(velocity, x, target, k, text, prefix, sigmas)
        else:
            v = velocity(x, k, text, prefix)
            wanted = (target - x) / (sigmas[k + 1] - sigmas[k]).view(-1, 1, 1, 1, 1)
            keep = _keep_mask(x, prefix)
            loss = (((v - wanted) ** 2) * keep).sum() / keep.sum()
        optimizer_step(loss, optimizer, params, schedule)
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
            checkpoint_params(work / f"{stage}.last.pt", params, average, optimizer, schedule, step,
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


def student_velocity(model, sigmas: torch.Tensor):
    """velocity(x, k, text, prefix): the student's velocity at each sample's window k (B,), in one forward: a
    timestep per sample, or per token with 0 on a continuation's clean prefix, as engine.loop.conditioning's clean
    tie gives it."""
    from engine.loop.conditioning import tied_tokens

    patch = model.config.patch_size

    def velocity(x, k, text, prefix):
        t = sigmas[k] * 1000
        if prefix.any():
            clean = tied_tokens(prefix, x, patch)
            return model(x, t[:, None].expand(clean.shape).masked_fill(clean, 0), text, return_dict=False)[0]
        return model(x, t, text, return_dict=False)[0]

    return velocity


def landing_loss(velocity, x, target, k, text, prefix, sigmas) -> torch.Tensor:
    """Where one Euler step from `x` at window k lands against `target`: the velocity's error times the window's
    length, normalised over the batch, so each window weighs as much as it moves the sample; a continuation's clean
    prefix outside the loss."""
    v = velocity(x, k, text, prefix)
    length = (sigmas[k + 1] - sigmas[k]).view(-1, 1, 1, 1, 1)
    keep = _keep_mask(x, prefix)
    return ((((v - (target - x) / length) ** 2) * keep * length**2 / (length**2).mean()).sum() / keep.sum())


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


@torch.no_grad()
def student_finals(pipe, config: DistillConfig, finished: dict, data: dict, batch: int = 32) -> torch.Tensor:
    """The student's final latents (normalised, as its sampler ends) from the teacher's noise of `data`: its Euler
    steps at its sigmas with the prompt alone, a continuation's prefix held clean with timestep 0 on its tokens, as
    the engine renders toy-fast."""
    from peft.utils import set_peft_model_state_dict

    from engine.loop.conditioning import tied_tokens
    from toyworld.train_transformer import prompt_table

    _, embeds, _ = prompt_table(pipe)
    student = finished[final_stage(config)]
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
