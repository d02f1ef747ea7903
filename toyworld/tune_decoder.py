"""`reelbatch toy tune-decoder`: fine-tune a distilled registration's light decoder toward its teacher's colours.

A light decoder trained with most of its loss on the object's pixels (toyworld.distill_decoder) decoded toy-fast's
greens as limes and laid a yellow-green tint and a red mesh over gray backgrounds: on a held-out draw the toy judge
read colour in 76.9% of its videos against the teacher's 98.8%, and clean backgrounds in 63.1% against 75.6%
(docs/TOY_TRAINING.md, "toy-fast's colour"). This fine-tunes the decoder it has with the distillation's own loss plus
its colour term (DistillConfig.decoder_colour_weight: every pixel's 4x4 block mean, background included, against the
VAE's), on pairs the engine renders: the student's final latents and the teacher's from the same noise and prompt,
the target the VAE's decode of the teacher's, as the decoder stage's student samples are. Seeds come from training's
range, never a held-out one, so the gate that judges the result afterwards is not tuned on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.adapters import light_decoder
from engine.engine import Engine
from engine.types import RenderBatch, RenderRequest
from toyworld.distill_config import DistillConfig
from toyworld.distill_decoder import decoder_loss
from toyworld.distill_report import native
from toyworld.world import COMBINATIONS


@dataclass(frozen=True)
class TuneConfig:
    steps: int = 1000
    pairs: int = 800  # teacher/student latent pairs (10 per prompt)
    batch: int = 8  # of the teacher's latents and of the student's, each step
    lr: float = 1e-3
    seed: int = 20261203
    # Inside training's range [10^6, 2^31): the pairs' seeds are seed_base .. seed_base + pairs - 1.
    seed_base: int = 1_500_000_000
    log_every: int = 50


def render_pairs(engine: Engine, model: str, config: TuneConfig, batch: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's and the student's final latents (as the pipeline's loop ends, normalised) for `config.pairs`
    prompt/seed pairs, every prompt in turn: the same seed gives both the same initial noise."""
    teacher = engine.registry.get(model).teacher
    prompts = [f"a {c} {s} moving {d} on a {b} background" for c, s, d, b in COMBINATIONS]
    out = []
    for name in (teacher, model):
        shape, latents = native(engine.registry, name), []
        for start in range(0, config.pairs, batch):
            requests = tuple(RenderRequest(i, prompts[i % len(prompts)], None, config.seed_base + i,
                                           latents_only=True)
                             for i in range(start, min(config.pairs, start + batch)))
            latents += [video.latents for video in engine.render(RenderBatch(shape, requests))]
        out.append(torch.stack(latents))
    return out[0], out[1]


def tune(engine: Engine, model: str, config: TuneConfig, distill: DistillConfig | None = None,
         on_log: Callable[[dict], None] | None = None) -> tuple[light_decoder.LightDecoder, dict]:
    """`model`'s light decoder fine-tuned as the module says; returns it (eval mode) and what the run took."""
    distill = distill or DistillConfig()
    info = engine.registry.get(model)
    if info.teacher is None or info.decoder is None:
        raise ValueError(f"{model!r} needs a teacher and a light decoder to tune one toward the other")
    started = time.monotonic()
    teacher_z, student_z = render_pairs(engine, model, config)
    pipe = engine.pipeline(info.teacher)
    vae = pipe.vae
    view = (1, -1, 1, 1, 1)
    mean, std = torch.tensor(vae.config.latents_mean).view(view), torch.tensor(vae.config.latents_std).view(view)
    teacher_z, student_z = teacher_z * std + mean, student_z * std + mean  # what vae.decode takes
    with torch.no_grad():
        want = torch.cat([vae.decode(teacher_z[i : i + 16], return_dict=False)[0] for i in range(0, len(teacher_z), 16)])
    render_s = time.monotonic() - started
    decoder = light_decoder.load(info.decoder).train().requires_grad_(True)
    params = list(decoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    rng = np.random.default_rng(config.seed)
    losses = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for step in range(config.steps):
            a, b = (torch.from_numpy(rng.integers(0, config.pairs, config.batch)) for _ in range(2))
            loss = (decoder_loss(decoder(teacher_z[a]), want[a], distill)
                    + decoder_loss(decoder(student_z[b]), want[b], distill))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            losses.append(loss.item())
            if on_log and ((step + 1) % config.log_every == 0 or step + 1 == config.steps):
                on_log({"stage": "tune-decoder", "step": step + 1, "of": config.steps,
                        "loss": float(np.mean(losses[-config.log_every:]))})
    decoder.eval().requires_grad_(False)
    return decoder, {"render_s": render_s, "train_s": time.monotonic() - started - render_s,
                     "loss": float(np.mean(losses[-config.log_every:])) if losses else float("nan"),
                     "config": config}
