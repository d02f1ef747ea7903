"""Stages 1 and 2 of `toy distill` (toyworld.distill): the teacher's trajectories, free samples of every prompt and
continuations of a clean prefix as a long video's next chunk, saved in shards so a killed stage redoes one at most.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from toyworld.distill_config import QUALITY_SEEDS, DistillConfig, rng_for, student_sigmas, teacher_sigmas
from toyworld.plumbing import Logger
from toyworld.world import COMBINATIONS


def generate_free(pipe, config: DistillConfig, work: Path, logger: "Logger", finished: dict) -> dict:
    return _generate(pipe, config, work, logger, "teacher", config.samples, None)


def generate_continuations(pipe, config: DistillConfig, work: Path, logger: "Logger", finished: dict) -> dict:
    return _generate(pipe, config, work, logger, "continuations", config.continuations, finished["teacher"])


def _generate(pipe, config: DistillConfig, work: Path, logger: "Logger", stage: str, count: int,
              free: dict | None) -> dict:
    """Teacher trajectories in shards (each saved when done, so a killed stage redoes one shard at most): the
    states at the student's sigmas (n, windows + 1, C, L, h, w), the prompt index and the clean prefix length."""
    from toyworld.train_transformer import prompt_table

    _, embeds, empty = prompt_table(pipe)
    windows = student_sigmas(config)
    fine, bounds = teacher_sigmas(config, windows)
    shards = []
    seconds = cpu = 0.0
    for index, start in enumerate(range(0, count, config.shard)):
        path = work / f"{stage}-{index:03d}.pt"
        if not path.is_file():
            started, cpu_started = time.monotonic(), time.process_time()
            n = min(config.shard, count - start)
            rng = rng_for(config, stage, index)
            prompts = _prompts(config, stage, start, n)
            noise = torch.cat([torch.randn((1, *_latent_shape(pipe)), generator=torch.Generator().manual_seed(s))
                               for s in _seeds(rng, n)])
            prefix = None
            if free is not None:  # the prefix: the end of a free sample of the same prompt
                finals = free["states"][:, -1]
                by_prompt = [torch.nonzero(free["prompts"] == p).flatten() for p in range(len(COMBINATIONS))]
                picks = [int(by_prompt[p][rng.integers(len(by_prompt[p]))]) for p in prompts.tolist()]
                prefix = finals[picks][:, :, -config.prefix_latents:]
            states = []
            for b in range(0, n, config.generate_batch):
                states.append(teacher_trajectory(
                    pipe.transformer, noise[b : b + config.generate_batch], embeds[prompts[b : b + config.generate_batch]],
                    empty, config.teacher_guidance, fine, bounds,
                    None if prefix is None else prefix[b : b + config.generate_batch]))
            shard = {"states": torch.cat(states), "prompts": prompts,
                     "prefix": torch.full((n,), 0 if prefix is None else config.prefix_latents),
                     "seconds": time.monotonic() - started, "cpu_seconds": time.process_time() - cpu_started}
            torch.save(shard, path.with_suffix(".tmp"))
            path.with_suffix(".tmp").replace(path)
            logger.log(stage=stage, step=start + n, of=count, seconds=seconds + shard["seconds"])
        shards.append(torch.load(path, weights_only=False))
        seconds += shards[-1]["seconds"]
        cpu += shards[-1].get("cpu_seconds", float("nan"))
    return {"states": torch.cat([s["states"] for s in shards]), "prompts": torch.cat([s["prompts"] for s in shards]),
            "prefix": torch.cat([s["prefix"] for s in shards]), "sigmas": windows, "seconds": seconds,
            "cpu_seconds": cpu}


def _prompts(config: DistillConfig, stage: str, start: int, n: int) -> torch.Tensor:
    """Prompt indices of samples start .. start + n - 1: every run of 80 holds each prompt once, in a seeded
    shuffle, whatever the shard size."""
    per = len(COMBINATIONS)
    cycles = range(start // per, (start + n - 1) // per + 1)
    order = np.concatenate([rng_for(config, stage, 10**6 + c).permutation(per) for c in cycles])
    offset = start - cycles[0] * per
    return torch.from_numpy(order[offset : offset + n])


def _latent_shape(pipe) -> tuple[int, int, int, int]:
    from toyworld.model import FRAMES, HEIGHT, SPATIAL, TEMPORAL, WIDTH

    return (pipe.transformer.config.in_channels, (FRAMES - 1) // TEMPORAL + 1, HEIGHT // SPATIAL, WIDTH // SPATIAL)


def _seeds(rng: np.random.Generator, n: int) -> list[int]:
    seeds = rng.integers(10**6, 2**31, n).tolist()
    assert not set(seeds) & set(QUALITY_SEEDS)
    return seeds


@torch.no_grad()
def teacher_trajectory(transformer, noise: torch.Tensor, text: torch.Tensor, empty: torch.Tensor, guidance: float,
                       sigmas: torch.Tensor, bounds: list[int], prefix: torch.Tensor | None) -> torch.Tensor:
    """engine.loop.denoise's loop with guidance batched, on explicit sigmas: (B, len(bounds), C, L, h, w), the state at
    each boundary. With `prefix` (B, C, p, h, w) the first p latents are held clean with timestep 0 on their tokens,
    as engine.loop.conditioning's clean tie does."""
    from engine.loop.conditioning import tied_tokens

    x = noise.clone()
    batch = len(x)
    context = torch.cat([text, empty.expand(batch, -1, -1)])
    clean = None
    if prefix is not None:
        p = prefix.shape[2]
        clean = tied_tokens(torch.full((batch,), p), x, transformer.config.patch_size)
    states = []
    for i in range(len(sigmas)):
        if prefix is not None:
            x[:, :, :p] = prefix
        if i in bounds:
            states.append(x.clone())
        if i == len(sigmas) - 1:
            break
        t = sigmas[i] * 1000
        timestep = t.expand(batch) if clean is None else t.expand(clean.shape).masked_fill(clean, 0)
        v_cond, v_uncond = transformer(torch.cat([x, x]), timestep.repeat(2, *([1] * (timestep.dim() - 1))), context,
                                       return_dict=False)[0].chunk(2)
        x = x + (sigmas[i + 1] - sigmas[i]) * (v_uncond + guidance * (v_cond - v_uncond))
    return torch.stack(states, dim=1)
