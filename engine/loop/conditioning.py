"""What a batch's videos are conditioned on in the engine's loop (engine.loop.denoise), besides their text: a long
video's chunk tied to the chunk before, a first frame held clean, or WanImageToVideoPipeline's picture inputs; and the
per-token timesteps those imply.

`conditions` (one per video, None for a free one): clean latents (C, o, h, w) the video's first o latent frames are
tied to, for a long video's next chunk (engine.long.chunks). Before each step the tied frames are set to the condition
noised to that step's level with the video's own initial noise, (1 - sigma) x c + sigma x noise, the
inpainting-style extension diffusion forcing generalises; from the step whose sigma falls below `release_sigma` they
are left to the model, so it can smooth the join (the stitch then crossfades). At 0 they are tied to the end and come
out equal to the condition. With `clean_condition` the tied frames are held at the clean condition at every step
instead and their tokens get timestep 0 (the rest the step's), as diffusion forcing feeds a clean prefix and Wan 2.2
TI2V its first frame (the transformer's per-token timesteps): for a model trained to continue one (`toy`).

`images` (one per video, None for one without): the latents (C, 1, h, w) of the picture a video starts from
(engine.loop.first_frame), its first latent frame held clean at every step with timestep 0 on its tokens, as Wan 2.2
TI2V conditions on its first frame (WanImageToVideoPipeline with expand_timesteps), whatever `clean_condition` and
`release_sigma` say of chunk ties. A video has an image or a condition, never both (a long video's image is its
first chunk's).

`picture` (engine.loop.i2v.prepare): WanImageToVideoPipeline's inputs for a batch (Wan 2.1 I2V, Wan 2.2 I2V A14B): its
initial noise replaces the loop's, and at every step the transformer reads the latents with the mask and picture
channels beside them, and the pictures' embedding where the transformer takes one, as that pipeline's loop does. A
long video's later chunk comes here with its own mask and channels (engine.loop.i2v), never with `conditions` or
`images`.

A folder with `expand_timesteps` (Wan 2.2 TI2V) gives the transformer a timestep per token, all the step's in
text-to-video (the pipeline's mask is all ones), which is also how a clean tie gives its tied tokens timestep 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.types import PictureInputs

# (latents, the step's sigma, released) -> the latents with each tied video's first frames set.
Tie = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Conditioning:
    conditions: list[torch.Tensor | None] | None = None
    release_sigma: float = 0.0
    clean_condition: bool = False
    images: list[torch.Tensor | None] | None = None
    picture: PictureInputs | None = None

    @property
    def any(self) -> bool:
        """Whether any video of the batch is conditioned on more than its text."""
        return (self.picture is not None or any(c is not None for c in self.conditions or ())
                or any(i is not None for i in self.images or ()))

    def check(self) -> None:
        tied_or_framed = (any(c is not None for c in self.conditions or ())
                          or any(i is not None for i in self.images or ()))
        if self.picture is not None and tied_or_framed:
            raise ValueError("a picture's mask and channels (image_condition: pipeline) do not combine with chunk "
                             "ties or first frames")

    def initial_latents(self, pipe, batch: int, height: int, width: int, frames: int,
                        generators: list[torch.Generator]) -> torch.Tensor:
        """Step 5 of the pipeline: its own prepare_latents (the same noise from the same generators), or for a
        picture WanImageToVideoPipeline's, prepared with its mask and channels (engine.loop.i2v.prepare; that pipeline
        sets no begin index)."""
        if self.picture is not None:
            return self.picture.latents
        latents = pipe.prepare_latents(batch, pipe.transformer.config.in_channels, height, width, frames,
                                       torch.float32, pipe._execution_device, generators, None)
        pipe.scheduler.set_begin_index(0)
        return latents

    def tie(self, noise: torch.Tensor) -> Tie | None:
        """A function setting each tied video's first latent frames at a step: an image's latent always clean; a
        chunk's condition noised to the step's level with the video's own initial noise (`noise`; clean with
        `clean_condition`), unless `released`. None when no video is tied."""
        found = []  # (video, clean latents, held: an image, tied to the end whatever the release)
        for i, latent in enumerate(self.conditions or ()):
            if latent is not None:
                found.append((i, latent, False))
        for i, latent in enumerate(self.images or ()):
            if latent is not None:
                if self.conditions and self.conditions[i] is not None:
                    raise ValueError(f"video {i} of the batch has both an image and a chunk condition")
                found.append((i, latent, True))
        if not found:
            return None
        # with each tied video's own initial noise
        tied = [(i, c.to(noise.device, noise.dtype), noise[i, :, : c.shape[1]].clone(), held) for i, c, held in found]
        clean = self.clean_condition

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

    def token_timesteps(self, pipe, tie: Tie | None, latents: torch.Tensor) -> torch.Tensor | None:
        """Per-token timesteps, as a (batch, tokens) multiplier of the step's timestep: 1 everywhere for TI2V (the
        pipeline's all-ones mask, as float32, so `keep * t` is its `mask * t` bit for bit), 0 on tokens held clean
        (a first frame, a clean chunk tie). None: one timestep per sample, as Wan 2.1's pipeline passes it."""
        batch = latents.shape[0]
        held_clean = tie is not None and (self.clean_condition or any(i is not None for i in self.images or ()))
        if not (pipe.config.expand_timesteps or held_clean):
            return None
        tied = torch.tensor([_clean_frames(c, i, self.clean_condition)
                             for c, i in zip(self.conditions or [None] * batch, self.images or [None] * batch)]
                            if held_clean else [0] * batch)
        return (~tied_tokens(tied, latents, pipe.transformer.config.patch_size)).to(torch.float32)

    def model_input(self, latents: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """What the transformer reads: the latents, and for a picture its mask and channels beside them
        (WanImageToVideoPipeline: `torch.cat([latents, condition], dim=1).to(transformer_dtype)`)."""
        if self.picture is None:
            return latents.to(dtype)
        return torch.cat([latents, self.picture.condition], dim=1).to(dtype)

    def transformer_inputs(self, passes: int) -> dict[str, torch.Tensor]:
        """What else the transformer reads: the pictures' embedding, once per pass of a stacked guidance call."""
        if self.picture is not None and self.picture.embeds is not None:
            return {"encoder_hidden_states_image": self.picture.embeds.repeat(passes, 1, 1)}
        return {}


def _clean_frames(condition: torch.Tensor | None, image: torch.Tensor | None, clean: bool) -> int:
    """How many of a video's first latent frames are held clean (their tokens get timestep 0)."""
    if image is not None:
        return image.shape[1]
    return condition.shape[1] if clean and condition is not None else 0


def tied_tokens(tied_frames: torch.Tensor, latents: torch.Tensor, patch_size: tuple[int, int, int]) -> torch.Tensor:
    """(batch, tokens) bool: the transformer's tokens (patches in frame-major order) lying in each video's first
    `tied_frames[i]` latent frames."""
    _, _, frames, height, width = latents.shape
    p_t, p_h, p_w = patch_size
    per_frame = (height // p_h) * (width // p_w)
    frame = torch.arange(frames // p_t, device=latents.device)
    tied = frame[None, :] < (tied_frames.to(latents.device)[:, None] // p_t)
    return tied.repeat_interleave(per_frame, dim=1)
