"""A picture as a video's first latent frame, for models registered with `image_condition: first_frame`.

Wan's VAE is causal in time: its first latent frame encodes frame 0 alone, so a picture encoded as a one-frame video
is exactly the latent a video starting with that picture has first. WanImageToVideoPipeline.prepare_latents computes
this for Wan 2.2 TI2V (expand_timesteps): the picture preprocessed by the pipeline's video processor, encoded, the
posterior's mode taken and normalised with the VAE's latent statistics. The denoising loop then holds it clean with
timestep 0 on its tokens (engine.loop.conditioning, `images`).
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


def first_frame_latents(pipe, image: np.ndarray) -> torch.Tensor:
    """The normalised latent (C, 1, h, w), float32 on the pipeline's device, of `image` (uint8 H x W x 3, at the
    video's size). One image per call, so a video's latent never depends on its batch-mates."""
    vae = pipe.vae
    height, width = image.shape[:2]
    # The pipeline's own preprocessing (PIL -> [-1, 1]), as WanImageToVideoPipeline.__call__ step 5 does.
    pixels = pipe.video_processor.preprocess(Image.fromarray(image), height=height, width=width)
    video = pixels.unsqueeze(2).to(vae.device, vae.dtype)  # (1, 3, 1, H, W)
    latent = vae.encode(video).latent_dist.mode()  # diffusers' retrieve_latents(..., sample_mode="argmax")
    view = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(view).to(latent.device, latent.dtype)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(view).to(latent.device, latent.dtype)
    return ((latent - mean) * inverse_std)[0].float()
