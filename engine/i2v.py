"""The image-to-video inputs of models registered with `image_condition: pipeline` (Wan 2.1 I2V, Wan 2.2 I2V A14B):
WanImageToVideoPipeline.__call__ steps 3 and 5, for a batch whose videos each start from their own picture. The
denoising itself is the engine's one loop (engine.denoise), which reads these inputs as one named step: the mask and
picture channels concatenated to the latents the transformer reads, and the picture's embedding beside the text.

The pipeline's own call takes one picture per call: with a list of pictures and a list of generators it repeats the
image embeddings and the encoded condition by the batch size (diffusers 0.3x-0.4x), so a batch of several pictures
fails. Here the image encoder and the condition's VAE encode run one picture at a time (so a video's inputs never
depend on its batch-mates) and the transformer over the whole batch; a batch of one is the pipeline's call op for op
(bit-identical in exact mode, tested).
Wan 2.2 TI2V (`expand_timesteps`) conditions on a clean first frame instead, the `first_frame` path (engine.denoise).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from engine.errors import RenderError
from engine.types import PictureInputs


def supports(pipe) -> bool:
    """A WanImageToVideoPipeline whose transformer takes the mask and condition channels beside the latents."""
    return hasattr(pipe, "encode_image") and not pipe.config.expand_timesteps


def prepare(pipe, images: list[np.ndarray], height: int, width: int, frames: int,
            generators: list[torch.Generator]) -> PictureInputs:
    """Steps 3 and 5 of WanImageToVideoPipeline.__call__, one picture at a time."""
    if not supports(pipe):
        raise RenderError("image_condition: pipeline needs a WanImageToVideoPipeline model without expand_timesteps "
                          "(register Wan 2.2 TI2V with image_condition: first_frame)")
    device = pipe._execution_device
    dtype = pipe.transformer.dtype
    pictures = [Image.fromarray(image) for image in images]

    # 3. Encode image embedding (only Wan 2.1 I2V's transformer takes one)
    embeds = None
    if pipe.transformer.config.image_dim is not None:
        embeds = torch.cat([pipe.encode_image(picture, device) for picture in pictures]).to(dtype)

    # 5. Prepare latent variables: each video's noise from its own generator, its picture encoded on its own
    latents, condition = [], []
    for picture, generator in zip(pictures, generators):
        pixels = pipe.video_processor.preprocess(picture, height=height, width=width).to(device, dtype=torch.float32)
        noise, mask_and_latent = pipe.prepare_latents(pixels, 1, pipe.vae.config.z_dim, height, width, frames,
                                                      torch.float32, device, [generator])
        latents.append(noise)
        condition.append(mask_and_latent)
    return PictureInputs(torch.cat(latents), torch.cat(condition), embeds)


def denoise_i2v(pipe, *, images: list[np.ndarray], prompt_embeds: torch.Tensor,
                negative_prompt_embeds: torch.Tensor | None, height: int, width: int, frames: int, steps: int,
                guidance: float, generators: list[torch.Generator], guidance_2: float | None = None,
                should_stop: Callable[[], str | None] | None = None) -> torch.Tensor:
    """Latents for a batch, as `pipe(image=..., output_type="latent")` returns them for one video: the inputs
    prepared here, denoised by the engine's loop in exact mode (two transformer calls a step, as the pipeline)."""
    from engine import denoise

    picture = prepare(pipe, images, height, width, frames, generators)
    return denoise.denoise(pipe, prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds,
                           height=height, width=width, frames=frames, steps=steps, guidance=guidance,
                           guidance_2=guidance_2, generators=generators, batched_guidance=False, picture=picture,
                           should_stop=should_stop)
