"""The denoising loop of diffusers' WanPipeline.__call__ (steps 4-6), one loop for every model and input the engine
renders, with each concern a small named piece it calls, as the pipeline's own steps:
- guidance (engine.loop.guidance): the scales, both passes in one call or two, guidance on the first steps only;
- experts (engine.loop.experts.Stages): Wan 2.2 A14B's high-noise and low-noise transformers, switched at the boundary,
  each with its scale, the idle one swapped out;
- conditioning (engine.loop.conditioning): a long video's chunk tie, a first frame held clean, WanImageToVideoPipeline's
  picture inputs (Wan 2.1 I2V, Wan 2.2 I2V A14B), and the per-token timesteps they and Wan 2.2 TI2V use;
- stopping (engine.loop.stopping): the caller asked after every step.
With guidance unbatched and nothing lossy on this is the pipeline's loop op for op: bit-identical output against a
plain WanPipeline call, and with a picture's inputs against a WanImageToVideoPipeline call for a batch of one
(tested).

The first-block cache (`Engine` turns on diffusers' FirstBlockCache, a lossy accelerator behind its gate) skips the
remaining blocks of a step whose first block changed little. Its decision is taken for the whole batch, so with it
on a video's frames may depend on its batch-mates; the gate measures it at the batch size workers use.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from engine.loop import stopping
from engine.loop.conditioning import Conditioning
from engine.loop.experts import stages
from engine.loop.guidance import Guidance, prediction, prompts

NO_CONDITIONING = Conditioning()


def supports(pipe) -> bool:
    """Whether this loop reproduces the pipeline: its transformer, and where the folder has them a second expert
    past the boundary (Wan 2.2 A14B) or per-token timesteps (Wan 2.2 TI2V)."""
    if pipe.transformer is None:
        return False
    if pipe.config.boundary_ratio is not None and getattr(pipe, "transformer_2", None) is None:
        return False
    # The pipeline takes per-token timesteps from every other latent row and column: 1x2x2 patches only.
    return not pipe.config.expand_timesteps or tuple(pipe.transformer.config.patch_size) == (1, 2, 2)


def denoise(pipe, *, prompt_embeds: torch.Tensor, negative_prompt_embeds: torch.Tensor | None, height: int,
            width: int, frames: int, steps: int, generators: list[torch.Generator], guidance: Guidance,
            conditioning: Conditioning = NO_CONDITIONING, should_stop: stopping.ShouldStop | None = None,
            activate: Callable[[torch.nn.Module], None] | None = None,
            noise_kept: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """Latents for a batch, as `pipe(..., output_type="latent", guidance_scale=guidance.scale,
    guidance_scale_2=guidance.scale_2)` returns them; one generator per video. `activate` is called with each step's
    expert before it runs (engine.loop.experts.ExpertSwap.activate); `should_stop` after each step; `noise_kept` once at
    the end with each video's noise_kept (B,) of its final latents against its initial noise."""
    conditioning.check()
    device = pipe._execution_device
    dtype = pipe.transformer.dtype
    text = prompts(guidance, prompt_embeds, negative_prompt_embeds, device, dtype)

    # 4. Prepare timesteps
    pipe.scheduler.set_timesteps(steps, device=device)
    timesteps = pipe.scheduler.timesteps

    # 5. Prepare latent variables, and what conditions them
    latents = conditioning.initial_latents(pipe, text.cond.shape[0], height, width, frames, generators)
    initial = latents.clone() if noise_kept is not None else None  # a scheduler may step in place
    tie = conditioning.tie(latents)
    keep = conditioning.token_timesteps(pipe, tie, latents)
    experts = stages(pipe, guidance, activate)

    def run(model, t: torch.Tensor, name: str, hidden: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """One transformer call, as WanPipeline.__call__ makes it, over `hidden` (one pass of the batch, or both
        guidance passes stacked)."""
        passes = hidden.shape[0] // latents.shape[0]
        timestep = t.expand(hidden.shape[0]) if keep is None else (keep * t).repeat(passes, 1)
        inputs = dict(hidden_states=hidden, timestep=timestep, encoder_hidden_states=context, return_dict=False,
                      **conditioning.transformer_inputs(passes))
        if not getattr(model, "is_cache_enabled", False):
            return model(**inputs)[0]
        with model.cache_context(name):  # a step cache keeps state per kind of call
            return model(**inputs)[0]

    # 6. Denoising loop
    for i, t in enumerate(timesteps):
        if tie is not None:
            sigma = float(pipe.scheduler.sigmas[i])
            latents = tie(latents, sigma, released=sigma < conditioning.release_sigma)
        model, scale = experts.at(t)
        x = conditioning.model_input(latents, dtype)
        noise_pred = prediction(partial(run, model, t), guidance, i, scale, x, text)
        latents = pipe.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        stopping.check(should_stop)
    if tie is not None:
        latents = tie(latents, 0.0, released=conditioning.release_sigma > 0)
    if noise_kept is not None:
        noise_kept(kept(initial, latents))
    return latents


def kept(initial: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """How much of its initial noise each video's final latents (B, C, F, h, w) still are: the largest cosine
    similarity, over latent frames, between a frame's final latents and its initial noise. 1 for a denoiser that
    moved nothing (a transformer whose output is zero leaves the noise as it was); a working one draws latents of
    its own (docs/QUALITY.md, "Checks on every video", has the values). The largest over frames, because a frame
    held to a picture or a chunk before (engine.loop.conditioning) moves whatever the denoiser does; NaN where the
    latents are not finite. Two reductions over the latents: nothing beside a transformer call."""
    a, b = initial.float().flatten(3), final.float().flatten(3)  # (B, C, F, h*w)
    dot = (a * b).sum(dim=(1, 3))
    norms = a.square().sum(dim=(1, 3)).sqrt() * b.square().sum(dim=(1, 3)).sqrt()
    return (dot / norms).amax(dim=1)
