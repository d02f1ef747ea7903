"""Latents to frames: the end of diffusers' WanPipeline.__call__ (de-normalise, decode, post-process), split out so
the engine, a long video's stitched decode and the quality tools decode the same way, and so a light decoder
(engine.adapters.light_decoder) can take the VAE decoder's place.

Apart from engine.engine because it is the one step every caller of a pipeline shares, and the one whose bytes are
tested against diffusers' own output.
"""

from __future__ import annotations

import numpy as np
import torch


def decode_latents(pipe, latents: torch.Tensor, decoder: torch.nn.Module | None = None) -> np.ndarray:
    """Latents to (B, F, H, W, 3) floats in [0, 1]: the end of diffusers' WanPipeline.__call__ (0.3x-0.4x), op for op,
    so a render split here is bit-identical to one call with output_type="np". A light `decoder`
    (engine.adapters.light_decoder) takes the place of `vae.decode`: the same input, the same output range."""
    return pipe.video_processor.postprocess_video(_decode(pipe, latents, decoder), output_type="np")


def decode_uint8(pipe, latents: torch.Tensor, decoder: torch.nn.Module | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Latents to (B, F, H, W, 3) uint8 frames, and per video whether its frames were finite. The conversion runs
    where the decode ran (on a GPU a quarter of the bytes then cross to the host) and computes what the host did
    with decode_latents' frames, np.rint(frames * 255) clipped: the same float32 product and the same rounding (half
    to even), so the same bytes (tested)."""
    video = pipe.video_processor.postprocess_video(_decode(pipe, latents, decoder), output_type="pt").float()
    finite = torch.isfinite(video).flatten(1).all(dim=1)
    frames = (video * 255.0).round_().clamp_(0, 255).to(torch.uint8).permute(0, 1, 3, 4, 2)  # (B, F, H, W, 3)
    return frames.cpu().numpy(), finite.cpu().numpy()


def _decode(pipe, latents: torch.Tensor, decoder: torch.nn.Module | None) -> torch.Tensor:
    """WanPipeline.__call__'s de-normalisation and vae.decode (or the light decoder): (B, 3, F, H, W) in [-1, 1]."""
    vae = pipe.vae
    latents = latents.to(vae.device, vae.dtype)
    view = (1, vae.config.z_dim, 1, 1, 1)
    latents_mean = torch.tensor(vae.config.latents_mean).view(view).to(latents.device, latents.dtype)
    latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(view).to(latents.device, latents.dtype)
    latents = latents / latents_std + latents_mean
    return vae.decode(latents, return_dict=False)[0] if decoder is None else decoder.decode(latents)
