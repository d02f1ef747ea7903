"""The image-to-video inputs of models registered with `image_condition: pipeline` (Wan 2.1 I2V, Wan 2.2 I2V A14B):
WanImageToVideoPipeline.__call__ steps 3 and 5, for a batch whose videos each start from their own picture, or (a long
video's later chunk) from the last frames of the chunk before. The denoising itself is the engine's one loop
(engine.loop.denoise), which reads these inputs as one named step: the mask and picture channels concatenated to the
latents the transformer reads, and the picture's embedding beside the text.

The pipeline's own call takes one picture per call: with a list of pictures and a list of generators it repeats the
image embeddings and the encoded condition by the batch size (diffusers 0.3x-0.4x), so a batch of several pictures
fails. Here the image encoder and the condition's VAE encode run one video at a time (so a video's inputs never
depend on its batch-mates) and the transformer over the whole batch; a batch of one is the pipeline's call op for op
(bit-identical in exact mode, tested).

A long video from a picture (engine.long.chunks) renders its first chunk from the picture, exactly as a short video, and
each later chunk conditioned the way this pipeline conditions on anything: the VAE encoding of [known frames, zeros]
beside a mask of ones over the known frames. The known frames are the chunk before's last ones: its last `overlap`
latents (the tie the text path uses) decoded on their own, which the causal VAE turns into 1 + 4 (overlap - 1)
frames, since it decodes a first latent as one frame. That count puts this chunk's latent grid on the previous
chunk's: this chunk's latent j ends on the frame where the previous chunk's latent (L - overlap + j) ends, so the
stitch (engine.long.stitch) crossfades latents that cover the same frames. Chosen over tying the latents themselves (the
text path's tie, engine.loop.conditioning `conditions`): the I2V model was trained to reproduce the frames its mask
marks and continue them, not to denoise around latents set from outside, and the previous chunk's latents sit on another
time grid (its four-frame groups where this chunk's first latent is one frame); the mask is how the pipeline itself
takes a first and a last frame (its `last_image`). The image encoder (Wan 2.1 I2V) reads the first known frame, the
frame the chunk starts from, as it reads the picture of a first chunk.
Wan 2.2 TI2V (`expand_timesteps`) conditions on a clean first frame instead, the `first_frame` path
(engine.loop.denoise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from engine.errors import RenderError
from engine.frames.decode import decode_uint8
from engine.types import PictureInputs


def supports(pipe) -> bool:
    """A WanImageToVideoPipeline whose transformer takes the mask and condition channels beside the latents."""
    return hasattr(pipe, "encode_image") and not pipe.config.expand_timesteps


def prepare(pipe, images: Sequence[np.ndarray | None], height: int, width: int, frames: int,
            generators: list[torch.Generator], tails: Sequence[torch.Tensor | None] | None = None) -> PictureInputs:
    """Steps 3 and 5 of WanImageToVideoPipeline.__call__, one video at a time: from its picture (`images[i]`), or
    for a long video's later chunk from `tails[i]`, the clean latents (C, o, h, w) of the chunk before's last o
    latent frames (RenderRequest.condition)."""
    if not supports(pipe):
        raise RenderError("image_condition: pipeline needs a WanImageToVideoPipeline model without expand_timesteps "
                          "(register Wan 2.2 TI2V with image_condition: first_frame)")
    device = pipe._execution_device
    dtype = pipe.transformer.dtype
    tails = tails or [None] * len(images)
    starts, latents, condition = [], [], []
    for image, tail, generator in zip(images, tails, generators):
        if (image is None) == (tail is None):
            raise RenderError("a video on the pipeline image path starts from a picture or, as a long video's later "
                              "chunk, from the chunk before: exactly one of the two")
        if image is not None:
            # 5. Prepare latent variables: the video's noise from its own generator, its picture encoded on its own
            picture = Image.fromarray(image)
            pixels = pipe.video_processor.preprocess(picture, height=height, width=width).to(device, torch.float32)
            noise, mask_and_latent = pipe.prepare_latents(pixels, 1, pipe.vae.config.z_dim, height, width, frames,
                                                          torch.float32, device, [generator])
        else:
            known = last_frames(pipe, tail)
            picture = Image.fromarray(known[0])
            noise, mask_and_latent = continuation_latents(pipe, known, height, width, frames, generator)
        starts.append(picture)
        latents.append(noise)
        condition.append(mask_and_latent)

    # 3. Encode image embedding (only Wan 2.1 I2V's transformer takes one): each video's first frame
    embeds = None
    if pipe.transformer.config.image_dim is not None:
        embeds = torch.cat([pipe.encode_image(picture, device) for picture in starts]).to(dtype)
    return PictureInputs(torch.cat(latents), torch.cat(condition), embeds)


def last_frames(pipe, tail: torch.Tensor) -> np.ndarray:
    """The chunk before's last frames, uint8 (1 + 4 (o - 1), H, W, 3): its last o latents decoded on their own by the
    pipeline's VAE (engine.frames.decode, as a video's frames are), as the frames a user would hand the pipeline."""
    (frames,), _ = decode_uint8(pipe, tail[None])
    return frames


def continuation_latents(pipe, known: np.ndarray, height: int, width: int, frames: int,
                         generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """WanImageToVideoPipeline.prepare_latents with `known` (uint8 (n, H, W, 3)) as the video's first n frames where
    the pipeline takes a picture as its first: the noise drawn first from the generator, the condition the normalised
    VAE encoding (posterior mode) of [known frames, zeros], and the mask ones over the known frames, folded into the
    latent grid as the pipeline folds it (the first frame's mask repeated over the VAE's temporal factor). With n = 1
    this is the pipeline's own inputs for that frame as a picture (tested)."""
    device = pipe._execution_device
    vae, temporal = pipe.vae, pipe.vae_scale_factor_temporal
    latent_frames = (frames - 1) // temporal + 1
    h, w = height // pipe.vae_scale_factor_spatial, width // pipe.vae_scale_factor_spatial
    noise = randn_tensor((1, vae.config.z_dim, latent_frames, h, w), generator=[generator], device=device,
                         dtype=torch.float32)

    n = len(known)
    if n > frames:
        raise RenderError(f"{n} known frames do not fit a chunk of {frames}")
    pixels = torch.cat([pipe.video_processor.preprocess(Image.fromarray(f), height=height, width=width)
                        for f in known]).to(device, torch.float32)  # (n, 3, H, W)
    pixels = pixels.transpose(0, 1).unsqueeze(0)  # (1, 3, n, H, W)
    video = torch.cat([pixels, pixels.new_zeros(1, 3, frames - n, height, width)], dim=2)
    latent = vae.encode(video.to(vae.device, vae.dtype)).latent_dist.mode()  # retrieve_latents(..., "argmax")
    view = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(view).to(device, torch.float32)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(view).to(device, torch.float32)
    latent = (latent.to(device, torch.float32) - mean) * inverse_std

    mask = torch.ones(1, 1, frames, h, w)
    mask[:, :, n:] = 0
    mask = torch.cat([mask[:, :, 0:1].repeat_interleave(temporal, dim=2), mask[:, :, 1:]], dim=2)
    mask = mask.view(1, -1, temporal, h, w).transpose(1, 2).to(latent.device)
    return noise, torch.cat([mask, latent], dim=1)


def denoise_i2v(pipe, *, images: list[np.ndarray], prompt_embeds: torch.Tensor,
                negative_prompt_embeds: torch.Tensor | None, height: int, width: int, frames: int, steps: int,
                guidance: float, generators: list[torch.Generator], guidance_2: float | None = None,
                should_stop: Callable[[], str | None] | None = None) -> torch.Tensor:
    """Latents for a batch, as `pipe(image=..., output_type="latent")` returns them for one video: the inputs
    prepared here, denoised by the engine's loop in exact mode (two transformer calls a step, as the pipeline)."""
    from engine.loop import denoise
    from engine.loop.conditioning import Conditioning
    from engine.loop.guidance import Guidance

    picture = prepare(pipe, images, height, width, frames, generators)
    return denoise.denoise(pipe, prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds,
                           height=height, width=width, frames=frames, steps=steps, generators=generators,
                           guidance=Guidance(guidance, guidance_2, batched=False),
                           conditioning=Conditioning(picture=picture), should_stop=should_stop)
