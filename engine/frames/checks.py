"""What a render refuses: a shape WanPipeline would silently round or refuse, a picture not fitted to the video, and
frames that must never be uploaded (non-finite or blank).

Apart from engine.engine so that every refusal a batch can meet, before and after the pipeline runs, reads in one
place; each is a RenderError or a RenderedVideo carrying its error.
"""

from __future__ import annotations

import math

import numpy as np

from engine import parallel
from engine.errors import RenderError
from engine.types import RenderedVideo, Shape


def check_shape(pipe, shape) -> None:
    """What WanPipeline would silently round (frames; sides to the VAE's scale x the patch) or refuse (sides not
    multiples of 16), refused here with the numbers: 16 for Wan 2.1 and 2.2 A14B, 32 for TI2V (16x VAE, 2x2
    patches)."""
    temporal = pipe.vae_scale_factor_temporal
    patch = (pipe.transformer if pipe.transformer is not None else pipe.transformer_2).config.patch_size
    multiple = math.lcm(16, pipe.vae_scale_factor_spatial * patch[1], pipe.vae_scale_factor_spatial * patch[2])
    if shape.height % multiple or shape.width % multiple:
        raise RenderError(f"{shape.width}x{shape.height}: sides must be multiples of {multiple} for {shape.model}")
    if shape.frames % temporal != 1:
        raise RenderError(f"{shape.frames} frames: {shape.model} renders {temporal}k+1 frames")
    transformer = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
    layout = getattr(transformer, "_reelbatch_layout", None)  # engine.parallel.apply
    if layout is not None:
        cell = pipe.vae_scale_factor_spatial
        tokens = (((shape.frames - 1) // temporal + 1) // patch[0] * (shape.height // (cell * patch[1]))
                  * (shape.width // (cell * patch[2])))
        why = parallel.problem(layout, transformer.config.num_attention_heads, tokens)
        if why is not None:
            raise RenderError(f"{shape.key()}: {why}")


def check_images(shape: Shape, requests) -> None:
    """Pictures come fitted to the video's size (engine.frames.images.fit_image); anything else is a caller's bug."""
    for r in requests:
        if r.image is not None and (r.image.shape != (shape.height, shape.width, 3) or r.image.dtype != np.uint8):
            raise RenderError(f"video {r.video_id}: its image is {r.image.dtype} {r.image.shape}, expected uint8 "
                              f"{(shape.height, shape.width, 3)}")


def checked(request, frames: np.ndarray, finite: bool, stages: dict[str, float]) -> RenderedVideo:
    """A video's uint8 frames, refusing output that must never be uploaded. A refusal is a RenderError, which fails
    the video at once (engine.errors): the frames follow from the model, the settings, the prompt and the seed, so
    another attempt would render the same ones (a decoder that gives flat frames gave them three times over when
    these were retried)."""
    if not finite:
        return RenderedVideo(request, None, RenderError("render produced non-finite values (NaN or Inf)"), stages)
    if frames.min() == frames.max():
        return RenderedVideo(request, None, RenderError(f"render produced blank frames (every pixel "
                                                        f"{int(frames.min())})"), stages)
    return RenderedVideo(request, frames, None, stages)
