"""The image-to-video path of models registered with `image_condition: pipeline` (Wan 2.1 I2V, Wan 2.2 I2V A14B):
WanImageToVideoPipeline.__call__ steps 3-6, for a batch whose videos each start from their own picture.

The pipeline's own call takes one picture per call: with a list of pictures and a list of generators it repeats the
image embeddings and the encoded condition by the batch size (diffusers 0.3x-0.4x), so a batch of several pictures
fails. This loop runs the same operations per video where the pipeline runs them per call (the image encoder and the
condition's VAE encode, one picture each, so a video's inputs never depend on its batch-mates) and the transformer
over the whole batch; a batch of one is the pipeline's call op for op (bit-identical, tested).
Wan 2.2 TI2V (`expand_timesteps`) conditions on a clean first frame instead, the `first_frame` path (engine.denoise).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from engine.errors import RenderError, RenderInterrupted


def supports(pipe) -> bool:
    """A WanImageToVideoPipeline whose transformer takes the mask and condition channels beside the latents."""
    return hasattr(pipe, "encode_image") and not pipe.config.expand_timesteps


def denoise_i2v(pipe, *, images: list[np.ndarray], prompt_embeds: torch.Tensor,
                negative_prompt_embeds: torch.Tensor | None, height: int, width: int, frames: int, steps: int,
                guidance: float, generators: list[torch.Generator],
                should_stop: Callable[[], str | None] | None = None) -> torch.Tensor:
    """Latents for a batch, as `pipe(image=..., output_type="latent")` returns them for one video."""
    if not supports(pipe):
        raise RenderError("image_condition: pipeline needs a WanImageToVideoPipeline model without expand_timesteps "
                          "(register Wan 2.2 TI2V with image_condition: first_frame)")
    device = pipe._execution_device
    transformer = pipe.transformer
    dtype = transformer.dtype
    guided = guidance > 1.0  # WanImageToVideoPipeline.do_classifier_free_guidance
    cond = prompt_embeds.to(device, dtype)
    uncond = negative_prompt_embeds.to(device, dtype) if guided else None
    pictures = [Image.fromarray(image) for image in images]

    # 3. Encode image embedding (only Wan 2.1 I2V's transformer takes one), one picture at a time
    image_embeds = None
    if transformer.config.image_dim is not None:
        image_embeds = torch.cat([pipe.encode_image(picture, device) for picture in pictures]).to(dtype)

    # 4. Prepare timesteps
    pipe.scheduler.set_timesteps(steps, device=device)
    timesteps = pipe.scheduler.timesteps

    # 5. Prepare latent variables: each video's noise from its own generator, its picture encoded on its own
    latents, condition = [], []
    for picture, generator in zip(pictures, generators):
        pixels = pipe.video_processor.preprocess(picture, height=height, width=width).to(device, dtype=torch.float32)
        noise, mask_and_latent = pipe.prepare_latents(pixels, 1, pipe.vae.config.z_dim, height, width, frames,
                                                      torch.float32, device, [generator])
        latents.append(noise)
        condition.append(mask_and_latent)
    latents, condition = torch.cat(latents), torch.cat(condition)

    # 6. Denoising loop (Wan 2.2 A14B: the high-noise expert above the boundary, the low-noise one below)
    boundary = None
    if pipe.config.boundary_ratio is not None:
        boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
    for t in timesteps:
        model = transformer if boundary is None or t >= boundary else pipe.transformer_2
        x = torch.cat([latents, condition], dim=1).to(dtype)
        timestep = t.expand(latents.shape[0])
        with model.cache_context("cond"):
            noise_pred = model(hidden_states=x, timestep=timestep, encoder_hidden_states=cond,
                               encoder_hidden_states_image=image_embeds, return_dict=False)[0]
        if guided:
            with model.cache_context("uncond"):
                noise_uncond = model(hidden_states=x, timestep=timestep, encoder_hidden_states=uncond,
                                     encoder_hidden_states_image=image_embeds, return_dict=False)[0]
                noise_pred = noise_uncond + guidance * (noise_pred - noise_uncond)
        latents = pipe.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        if should_stop is not None and (reason := should_stop()):
            raise RenderInterrupted(reason)
    return latents
