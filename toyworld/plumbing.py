"""What every stage of the toy's training shares: the stages' names (each draws its own random numbers), progress,
checkpoints that resume a killed run, the config check of a work folder, the loss log, and the VAE encode of clips.

Kept apart from toyworld.train (the stages of `reelbatch toy train`) so the later stages
(toyworld.train_transformer, toyworld.train_first_frame, toyworld.distill_student, toyworld.distill_decoder)
import it without importing the runner, and the runner imports them at the top.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

STAGES = ("vae", "decoder", "latents", "transformer", "continuation")
# Stages run by other commands on these weights (toyworld.train_first_frame and train_first_frame_vae: `toy-i2v`),
# numbered after STAGES so their random draws never repeat a stage's.
LATER_STAGES = ("first_frame", "first_frame_vae")


@dataclass
class Progress:
    """What a finished (or resumed) run reports: seconds per stage and the last logged losses."""

    seconds: dict[str, float]
    losses: dict[str, float]


def encode_clips(pipe, pairs, progress: Callable[[int], None] | None = None) -> tuple[torch.Tensor, list[str]]:
    """(prompt, clip) pairs through the VAE's encoder in batches of 32: the latents' means (B, C, L, h, w) and the
    prompts in order; `progress` hears the number encoded after each batch."""
    latents, prompts = [], []
    pairs = iter(pairs)
    with torch.no_grad():
        while batch := [pair for _, pair in zip(range(32), pairs)]:
            mean, _ = pipe.vae._encode(to_model_space(np.stack([clip for _, clip in batch]))).chunk(2, dim=1)
            latents.append(mean)
            prompts += [prompt for prompt, _ in batch]
            if progress:
                progress(len(prompts))
    return torch.cat(latents), prompts


def record_replaced(out: Path) -> None:
    """`out`/base.json for a folder loaded over `toy`'s (ModelInfo.base): the base and the components it holds over
    it (its folders with a diffusers config), so a rerun of one stage never forgets another's component."""
    replaced = sorted(p.name for p in out.iterdir() if (p / "config.json").is_file())
    (out / "base.json").write_text(json.dumps({"base": "toy", "replaced": replaced}, indent=2) + "\n")


def to_model_space(clips: np.ndarray) -> torch.Tensor:
    """uint8 (B, F, H, W, 3) to float (B, 3, F, H, W) in [-1, 1], the VAE's input range."""
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def stage_rng(config, stage: str, step: int) -> np.random.Generator:
    return np.random.default_rng([config.seed, (*STAGES, *LATER_STAGES).index(stage), step])


def warmup_cosine(optimizer, total: int, warmup: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_step(loss: torch.Tensor, optimizer, params, schedule) -> None:
    """One training step of every stage: the loss's gradients, clipped to norm 1, then the optimizer and the
    learning-rate schedule."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    schedule.step()


def save_checkpoint(path: Path, model, optimizer, schedule, step: int, seconds: float, average=None) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
             "step": step, "seconds": seconds}
    if average is not None:
        state["average"] = average.state_dict()
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def resume(path: Path, model, optimizer, schedule, average=None) -> tuple[int, float]:
    if not path.is_file():
        return 0, 0.0
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    if average is not None:
        average.load_state_dict(state["average"])
    log.info("resuming %s at step %d", path.name, state["step"])
    return state["step"], state["seconds"]


def check_config(config, work: Path) -> None:
    """A work folder belongs to one config: resuming with another would mix two runs' weights. Compared as JSON
    reads it back (a tuple field is a list there)."""
    saved = work / "config.json"
    wanted = json.loads(json.dumps(asdict(config)))
    if saved.is_file():
        found = json.loads(saved.read_text())
        if found != wanted:
            changed = sorted(k for k in wanted if found.get(k) != wanted[k])
            raise ValueError(f"{work} holds a run with a different config ({', '.join(changed)} differ); "
                             f"use another work folder or delete it")
    else:
        saved.write_text(json.dumps(wanted, indent=2) + "\n")


class Logger:
    def __init__(self, path: Path, on_log: Callable[[dict], None] | None):
        self.path, self.on_log = path, on_log

    def log(self, **record) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.on_log:
            self.on_log(record)
