"""The denoising loop of diffusers' WanPipeline.__call__ (steps 4-6), with classifier-free guidance in one forward.

diffusers runs the conditional and the unconditional pass as two transformer calls per step. Stacking them into one
call of twice the batch does the same arithmetic with half the kernel launches and weight reads, which matters most
for small clips, where each call is too small to fill the device. With `batched_guidance=False` this is the pipeline's
loop op for op (bit-identical output, tested); batched, matmuls of another batch size may round differently in the
last bit, which the quality gate measures (PSNR against the reference renders).

Wan 2.2's two-expert pipelines (`boundary_ratio`) and `expand_timesteps` are not handled here: the engine gives those
to the pipeline's own loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.errors import RenderInterrupted


def supports(pipe) -> bool:
    """Whether this loop reproduces the pipeline: one transformer, one timestep per sample."""
    return (getattr(pipe, "transformer_2", None) is None and pipe.config.boundary_ratio is None
            and not pipe.config.expand_timesteps)


def denoise(pipe, *, prompt_embeds: torch.Tensor, negative_prompt_embeds: torch.Tensor | None, height: int,
            width: int, frames: int, steps: int, guidance: float, generators: list[torch.Generator],
            batched_guidance: bool = True, should_stop: Callable[[], str | None] | None = None) -> torch.Tensor:
    """Latents for a batch, as `pipe(..., output_type="latent")` returns them."""
    device = pipe._execution_device
    transformer = pipe.transformer
    dtype = transformer.dtype
    guided = guidance > 1.0  # WanPipeline.do_classifier_free_guidance
    cond = prompt_embeds.to(device, dtype)
    uncond = negative_prompt_embeds.to(device, dtype) if guided else None
    batch = cond.shape[0]

    # 4. Prepare timesteps
    pipe.scheduler.set_timesteps(steps, device=device)
    timesteps = pipe.scheduler.timesteps

    # 5. Prepare latent variables (the pipeline's own method: the same noise from the same generators)
    latents = pipe.prepare_latents(batch, transformer.config.in_channels, height, width, frames, torch.float32,
                                   device, generators, None)
    pipe.scheduler.set_begin_index(0)
    context = torch.cat([cond, uncond]) if guided and batched_guidance else None

    # 6. Denoising loop
    for t in timesteps:
        x = latents.to(dtype)
        if context is not None:
            both = transformer(hidden_states=torch.cat([x, x]), timestep=t.expand(2 * batch),
                               encoder_hidden_states=context, return_dict=False)[0]
            noise_pred, noise_uncond = both.chunk(2)
        else:
            noise_pred = transformer(hidden_states=x, timestep=t.expand(batch), encoder_hidden_states=cond,
                                     return_dict=False)[0]
            if guided:
                noise_uncond = transformer(hidden_states=x, timestep=t.expand(batch), encoder_hidden_states=uncond,
                                           return_dict=False)[0]
        if guided:
            noise_pred = noise_uncond + guidance * (noise_pred - noise_uncond)
        latents = pipe.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        if should_stop is not None and (reason := should_stop()):
            raise RenderInterrupted(reason)
    return latents
