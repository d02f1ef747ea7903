"""The denoising loop of diffusers' WanPipeline.__call__ (steps 4-6), with classifier-free guidance in one forward.

diffusers runs the conditional and the unconditional pass as two transformer calls per step. Stacking them into one
call of twice the batch does the same arithmetic with half the kernel launches and weight reads, which matters most
for small clips, where each call is too small to fill the device. With `batched_guidance=False` this is the pipeline's
loop op for op (bit-identical output, tested); batched, matmuls of another batch size may round differently in the
last bit, which the quality gate measures (PSNR against the reference renders).

Lossy accelerators (off by default, and accepted by a run only behind a recorded quality gate, jobs.gates):
`guidance_steps` runs classifier-free guidance on the first steps only, where layout and colour are decided (the
rest take the conditional pass alone: half their transformer work), after "Applying guidance in a limited interval"
(Kynkaanniemi et al., 2024); the first-block cache (`Engine` turns on diffusers' FirstBlockCache) skips the
remaining blocks of a step whose first block changed little. Its decision is taken for the whole batch, so with it
on a video's frames may depend on its batch-mates; the gate measures it at the batch size workers use.

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
            batched_guidance: bool = True, guidance_steps: int | None = None,
            conditions: list[torch.Tensor | None] | None = None, release_sigma: float = 0.0,
            clean_condition: bool = False, images: list[torch.Tensor | None] | None = None,
            should_stop: Callable[[], str | None] | None = None) -> torch.Tensor:
    """Latents for a batch, as `pipe(..., output_type="latent")` returns them. `guidance_steps`: guide only the
    first this many steps (None: all of them).

    `conditions` (one per video, None for a free one): clean latents (C, o, h, w) the video's first o latent frames
    are tied to, for a long video's next chunk (engine.chunks). Before each step the tied frames are set to the
    condition noised to that step's level with the video's own initial noise, (1 - sigma) x c + sigma x noise, the
    inpainting-style extension diffusion forcing generalises; from the step whose sigma falls below `release_sigma`
    they are left to the model, so it can smooth the join (the stitch then crossfades). At 0 they are tied to the end
    and come out equal to the condition. With `clean_condition` the tied frames are held at the clean condition at
    every step instead and their tokens get timestep 0 (the rest the step's), as diffusion forcing feeds a clean
    prefix and Wan 2.2 TI2V its first frame (the transformer's per-token timesteps): for a model trained to continue
    one (`toy`).

    `images` (one per video, None for one without): the latents (C, 1, h, w) of the picture a video starts from
    (engine.first_frame), its first latent frame held clean at every step with timestep 0 on its tokens, as Wan 2.2
    TI2V conditions on its first frame (WanImageToVideoPipeline with expand_timesteps), whatever `clean_condition` and
    `release_sigma` say of chunk ties. A video has an image or a condition, never both (a long video's image is its
    first chunk's).
    """
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
    tie = _ties(conditions, images, clean_condition, latents)
    clean_tokens = None
    if tie is not None and (clean_condition or any(i is not None for i in images or ())):
        tied = torch.tensor([_clean_frames(c, i, clean_condition) for c, i in zip(conditions or [None] * batch,
                                                                                   images or [None] * batch)])
        clean_tokens = tied_tokens(tied, latents, transformer.config.patch_size)
    context = torch.cat([cond, uncond]) if guided and batched_guidance else None

    # A step cache (diffusers' hooks) keeps state per named call: one per kind of call, reset for each batch.
    cached = getattr(transformer, "is_cache_enabled", False)
    if cached:
        transformer._reset_stateful_cache()

    def forward(name: str, hidden: torch.Tensor, context: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if clean_tokens is None:
            timestep = t.expand(hidden.shape[0])
        else:  # (batch, tokens): 0 where a tied frame is, repeated for a stacked guidance pass
            timestep = t.expand(clean_tokens.shape).masked_fill(clean_tokens, 0).repeat(hidden.shape[0] // batch, 1)
        if not cached:
            return transformer(hidden_states=hidden, timestep=timestep, encoder_hidden_states=context,
                               return_dict=False)[0]
        with transformer.cache_context(name):
            return transformer(hidden_states=hidden, timestep=timestep, encoder_hidden_states=context,
                               return_dict=False)[0]

    # 6. Denoising loop
    for i, t in enumerate(timesteps):
        if tie is not None:
            sigma = float(pipe.scheduler.sigmas[i])
            latents = tie(latents, sigma, released=sigma < release_sigma)
        x = latents.to(dtype)
        guide = guided and (guidance_steps is None or i < guidance_steps)
        if guide and context is not None:
            noise_pred, noise_uncond = forward("both", torch.cat([x, x]), context, t).chunk(2)
        else:
            noise_pred = forward("cond", x, cond, t)
            if guide:
                noise_uncond = forward("uncond", x, uncond, t)
        if guide:
            noise_pred = noise_uncond + guidance * (noise_pred - noise_uncond)
        latents = pipe.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        if should_stop is not None and (reason := should_stop()):
            raise RenderInterrupted(reason)
    if tie is not None:
        latents = tie(latents, 0.0, released=release_sigma > 0)
    return latents


def _ties(conditions: list[torch.Tensor | None] | None, images: list[torch.Tensor | None] | None, clean: bool,
          noise: torch.Tensor):
    """A function setting each tied video's first latent frames at a step: an image's latent always clean; a chunk's
    condition noised to the step's level with the video's own initial noise (clean with `clean`), unless `released`.
    None when no video is tied."""
    tied = []  # (video, clean latents, their initial noise, held: an image, tied to the end whatever the release)
    for i, latent in enumerate(conditions or ()):
        if latent is not None:
            tied.append((i, latent, False))
    for i, latent in enumerate(images or ()):
        if latent is not None:
            if conditions and conditions[i] is not None:
                raise ValueError(f"video {i} of the batch has both an image and a chunk condition")
            tied.append((i, latent, True))
    if not tied:
        return None
    tied = [(i, c.to(noise.device, noise.dtype), noise[i, :, : c.shape[1]].clone(), held) for i, c, held in tied]

    def tie(latents: torch.Tensor, sigma: float, released: bool = False) -> torch.Tensor:
        latents = latents.clone()
        for i, c, start_noise, held in tied:
            if held:
                latents[i, :, : c.shape[1]] = c
            elif not released:
                s = 0.0 if clean else sigma
                latents[i, :, : c.shape[1]] = (1 - s) * c + s * start_noise
        return latents

    return tie


def _clean_frames(condition: torch.Tensor | None, image: torch.Tensor | None, clean: bool) -> int:
    """How many of a video's first latent frames are held clean (their tokens get timestep 0)."""
    if image is not None:
        return image.shape[1]
    return condition.shape[1] if clean and condition is not None else 0


def tied_tokens(tied_frames: torch.Tensor, latents: torch.Tensor, patch_size: tuple[int, int, int]) -> torch.Tensor:
    """(batch, tokens) bool: the transformer's tokens (patches in frame-major order) lying in each video's first
    `tied_frames[i]` latent frames."""
    batch, _, frames, height, width = latents.shape
    p_t, p_h, p_w = patch_size
    per_frame = (height // p_h) * (width // p_w)
    frame = torch.arange(frames // p_t, device=latents.device)
    tied = frame[None, :] < (tied_frames.to(latents.device)[:, None] // p_t)
    return tied.repeat_interleave(per_frame, dim=1)
