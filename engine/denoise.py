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

Wan 2.2 runs through the same loop, as WanPipeline.__call__ does it: a two-expert folder (T2V-A14B) denoises with
`transformer` while the timestep is at or above `boundary_ratio` x num_train_timesteps and with `transformer_2`
below, each with its own guidance scale (`guidance_2` for the low-noise one); a folder with `expand_timesteps`
(TI2V-5B) gives the transformer a timestep per token, all the step's in text-to-video (the pipeline's mask is all
ones), which is also how the clean tie of a long video's chunk gives its tied tokens timestep 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.errors import RenderInterrupted
from engine.experts import experts

if TYPE_CHECKING:
    from engine.types import PictureInputs


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
            width: int, frames: int, steps: int, guidance: float, generators: list[torch.Generator],
            guidance_2: float | None = None, batched_guidance: bool = True, guidance_steps: int | None = None,
            conditions: list[torch.Tensor | None] | None = None, release_sigma: float = 0.0,
            clean_condition: bool = False, images: list[torch.Tensor | None] | None = None,
            should_stop: Callable[[], str | None] | None = None,
            activate: Callable[[torch.nn.Module], None] | None = None,
            picture: PictureInputs | None = None) -> torch.Tensor:
    """Latents for a batch, as `pipe(..., output_type="latent", guidance_scale=guidance,
    guidance_scale_2=guidance_2)` returns them. `guidance_steps`: guide only the first this many steps (None: all of
    them). `activate` is called with each step's expert before it runs (engine.experts.ExpertSwap.activate).

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

    `picture` (engine.i2v.prepare): WanImageToVideoPipeline's inputs for a batch of pictures (Wan 2.1 I2V, Wan 2.2
    I2V A14B): its initial noise replaces the loop's, and at every step the transformer reads the latents with the
    mask and picture channels beside them, and the pictures' embedding where the transformer takes one, as that
    pipeline's loop does (bit-identical for a batch of one in exact mode, tested). Not with `conditions` or `images`.
    """
    tied_or_framed = any(c is not None for c in conditions or ()) or any(i is not None for i in images or ())
    if picture is not None and tied_or_framed:
        raise ValueError("a picture's mask and channels (image_condition: pipeline) do not combine with chunk ties "
                         "or first frames")
    device = pipe._execution_device
    transformer = pipe.transformer
    dtype = transformer.dtype
    guided = guidance > 1.0  # WanPipeline.do_classifier_free_guidance: the first scale decides for both experts
    cond = prompt_embeds.to(device, dtype)
    uncond = negative_prompt_embeds.to(device, dtype) if guided else None
    batch = cond.shape[0]

    # 4. Prepare timesteps
    pipe.scheduler.set_timesteps(steps, device=device)
    timesteps = pipe.scheduler.timesteps

    # 5. Prepare latent variables (the pipeline's own method: the same noise from the same generators); for a
    # picture, WanImageToVideoPipeline's, prepared with its mask and channels (engine.i2v.prepare; that pipeline sets
    # no begin index)
    if picture is None:
        latents = pipe.prepare_latents(batch, transformer.config.in_channels, height, width, frames, torch.float32,
                                       device, generators, None)
        pipe.scheduler.set_begin_index(0)
    else:
        latents = picture.latents
    tie = _ties(conditions, images, clean_condition, latents)
    # Per-token timesteps, as a (batch, tokens) multiplier of the step's timestep: 1 everywhere for TI2V (the
    # pipeline's all-ones mask, as float32, so `keep * t` is its `mask * t` bit for bit), 0 on tokens held clean (a
    # first frame, a clean chunk tie). None: one timestep per sample, as Wan 2.1's pipeline passes it.
    keep = None
    held_clean = tie is not None and (clean_condition or any(i is not None for i in images or ()))
    if pipe.config.expand_timesteps or held_clean:
        tied = torch.tensor([_clean_frames(c, i, clean_condition) for c, i in zip(conditions or [None] * batch,
                                                                                   images or [None] * batch)]
                            if held_clean else [0] * batch)
        keep = (~tied_tokens(tied, latents, transformer.config.patch_size)).to(torch.float32)
    context = torch.cat([cond, uncond]) if guided and batched_guidance else None

    # Wan 2.2 A14B: the high-noise expert for timesteps at or above the boundary, the low-noise one below it, guided
    # with guidance_2 (the pipeline's default for it: the first scale).
    boundary = None
    if pipe.config.boundary_ratio is not None:
        boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
        guidance_2 = guidance if guidance_2 is None else guidance_2

    # A step cache (diffusers' hooks) keeps state per named call, per expert: one per kind of call, reset each batch.
    for model in experts(pipe):
        if getattr(model, "is_cache_enabled", False):
            model._reset_stateful_cache()

    def model_input(latents: torch.Tensor) -> torch.Tensor:
        """What the transformer reads: the latents, and for a picture its mask and channels beside them
        (WanImageToVideoPipeline: `torch.cat([latents, condition], dim=1).to(transformer_dtype)`)."""
        if picture is None:
            return latents.to(dtype)
        return torch.cat([latents, picture.condition], dim=1).to(dtype)

    def forward(model, name: str, hidden: torch.Tensor, context: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if keep is None:
            timestep = t.expand(hidden.shape[0])
        else:  # repeated for a stacked guidance pass
            timestep = (keep * t).repeat(hidden.shape[0] // batch, 1)
        extra = {}
        if picture is not None and picture.embeds is not None:  # the picture's embedding, per pass of the stack
            extra["encoder_hidden_states_image"] = picture.embeds.repeat(hidden.shape[0] // batch, 1, 1)
        if not getattr(model, "is_cache_enabled", False):
            return model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=context, return_dict=False,
                         **extra)[0]
        with model.cache_context(name):
            return model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=context, return_dict=False,
                         **extra)[0]

    # 6. Denoising loop
    for i, t in enumerate(timesteps):
        if tie is not None:
            sigma = float(pipe.scheduler.sigmas[i])
            latents = tie(latents, sigma, released=sigma < release_sigma)
        if boundary is None or t >= boundary:  # Wan 2.1, or Wan 2.2's high-noise stage
            model, scale = transformer, guidance
        else:  # Wan 2.2's low-noise stage
            model, scale = pipe.transformer_2, guidance_2
        if activate is not None:
            activate(model)
        x = model_input(latents)
        guide = guided and (guidance_steps is None or i < guidance_steps)
        if guide and context is not None:
            noise_pred, noise_uncond = forward(model, "both", torch.cat([x, x]), context, t).chunk(2)
        else:
            noise_pred = forward(model, "cond", x, cond, t)
            if guide:
                noise_uncond = forward(model, "uncond", x, uncond, t)
        if guide:
            noise_pred = noise_uncond + scale * (noise_pred - noise_uncond)
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
