"""Stage 6, `first_frame`: the `toy` transformer fine-tuned to start a video from a given picture (`toy-i2v`).

An image-to-video render holds the image's latent (the VAE's causal first latent: frame 0 alone) clean as the video's
first latent frame, with timestep 0 on its tokens (engine.loop.denoise, as Wan 2.2 TI2V conditions on its first frame).
`toy`'s stage 5 taught its transformer to continue a clean prefix of 2 latents (a long video's overlap), never 1:
on the judged image set the shipped `toy` kept colour, shape and direction together in 83.75% of videos (target
90%).
This stage fine-tunes a copy of `toy`'s transformer on batches that mix three objectives, each clip drawn at random:

- first frame (`first_frame_fraction`): a window from a clip's start, its first latent clean, timestep 0 on its
  tokens and outside the loss: the image-to-video case;
- continuation (`continuation_fraction`): a window 3 latents into the clip with a clean 2-latent prefix, stage 5's
  case, so long videos keep working;
- the rest: stage 4's objective (no prefix), so prompts alone still render.

The VAE, text encoder, tokenizer and scheduler are `toy`'s, unchanged; only the transformer is written, and the
`toy-i2v` registration loads it over `toy`'s folder (ModelInfo.base), so the repository holds one copy of the rest.
Every draw comes from (seed, stage, step) as in toyworld.train, and the stage checkpoints, so a killed run resumes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from toyworld.model import FRAMES, HEIGHT, TEMPORAL, TOY_SEED, WIDTH
from toyworld.plumbing import Logger, Progress, check_config, encode_clips, record_replaced
from toyworld.train_transformer import _flow_matching, _prompt_ids, _texts, prompt_table
from toyworld.world import dataset

STAGE = "first_frame"


@dataclass(frozen=True)
class FirstFrameConfig:
    seed: int = TOY_SEED
    # 1600 steps with 60% first-frame windows: 800 steps at 50% kept colour, shape and direction together in 90.0% of
    # the judged image set, 1600 at 60% in 93.75% (docs/TOY_TRAINING.md, "The first-frame fine-tune").
    steps: int = 1600
    batch: int = 32
    lr: float = 5e-4
    warmup: int = 40
    ema: float = 0.99
    prompt_dropout: float = 0.1
    # 17-frame clips (9 latents): a window from the start for first frames and plain clips, one 3 latents in for
    # continuations. 30 a prompt, drawn with a seed no other stage uses.
    clips: int = 2400
    first_frame_fraction: float = 0.6
    continuation_fraction: float = 0.2
    prefix_latents: int = 2  # a continuation's clean prefix: toy's chunk_overlap, as in stage 5
    checkpoint_every: int = 100
    log_every: int = 25


def train_first_frame(config: FirstFrameConfig, base: Path, work: Path, out: Path,
                      on_log: Callable[[dict], None] | None = None) -> Progress:
    """Fine-tune the transformer of the pipeline in `base` (resuming in `work`); write it to `out`/transformer."""
    from diffusers import WanPipeline

    work.mkdir(parents=True, exist_ok=True)
    check_config(config, work)
    pipe = WanPipeline.from_pretrained(base, use_safetensors=True)
    pipe.text_encoder.requires_grad_(False).eval()
    pipe.vae.requires_grad_(False).eval()
    logger = Logger(work / "train-log.jsonl", on_log)
    done = work / f"{STAGE}.done.pt"
    if done.is_file():
        state = torch.load(done, weights_only=False)
        pipe.transformer.load_state_dict(state["transformer"])
    else:
        state = _stage(pipe, config, work, logger)
        torch.save(state, work / f"{STAGE}.tmp")
        (work / f"{STAGE}.tmp").replace(done)
        (work / f"{STAGE}.last.pt").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    pipe.transformer.save_pretrained(out / "transformer", safe_serialization=True)
    record_replaced(out)
    return Progress(seconds={STAGE: state["seconds"]}, losses={STAGE: state["loss"]})


def _stage(pipe, config: FirstFrameConfig, work: Path, logger: Logger) -> dict:
    started = time.monotonic()
    window = (FRAMES - 1) // TEMPORAL + 1
    offset = window - config.prefix_latents
    # The encoder reads frames in groups of 4 after the first, so a clip is 4k + 1 frames long (as in stage 5).
    frames = 1 + 4 * math.ceil(((offset + window - 1) * TEMPORAL) / 4)
    vae = pipe.vae
    view = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(view)
    std = torch.tensor(vae.config.latents_std).view(view)
    z, clip_prompts = encode_clips(pipe, dataset(config.clips, config.seed + 6, frames=frames, width=WIDTH,
                                                  height=HEIGHT))
    latents = (z - mean) / std
    prompts, embeds, empty = prompt_table(pipe)
    prompt_ids = _prompt_ids(prompts, clip_prompts)
    encode_s = time.monotonic() - started
    logger.log(stage=STAGE, step=0, of=config.steps, clips=len(latents), seconds=encode_s)

    def batch(rng: np.random.Generator):
        pick = rng.integers(0, len(latents), config.batch)
        u = rng.random(config.batch)
        first = u < config.first_frame_fraction
        continued = ~first & (u < config.first_frame_fraction + config.continuation_fraction)
        starts = np.where(continued, offset, 0)
        x0 = torch.stack([latents[i, :, s : s + window] for i, s in zip(pick.tolist(), starts.tolist())])
        prefix = torch.from_numpy(np.where(first, 1, np.where(continued, config.prefix_latents, 0)))
        return x0, _texts(config, rng, embeds[prompt_ids[torch.from_numpy(pick)]], empty), prefix

    state = _flow_matching(pipe.transformer, config, work, logger, stage=STAGE, batch=batch, steps=config.steps,
                           lr=config.lr, warmup=config.warmup, ema=config.ema, fixed_decay=True)
    state["seconds"] += encode_s
    return state

