"""Plain values passed between the job system and the engine. No ORM rows cross this line."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import RenderError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Shape:
    """Everything that must match for videos to share one pipeline call."""

    model: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    # Videos that start from an image, kept out of batches with text-only videos (a model's registration says
    # whether they must be: ModelInfo.mixed_image_batches). False for text-only videos and for image videos that may
    # share a batch with them, so both keep the plain key.
    image: bool = False

    def key(self) -> str:
        """A stable text form, stored on work units so the database can group same-shape work."""
        key = f"{self.model}|{self.width}x{self.height}|f{self.frames}|s{self.steps}|g{self.guidance:g}"
        return key + "|image" if self.image else key

    @classmethod
    def parse(cls, key: str) -> Shape:
        """The shape whose key() is `key`."""
        model, size, frames, steps, guidance, *image = key.split("|")
        width, height = size.split("x")
        return cls(model, int(width), int(height), int(frames[1:]), int(steps[1:]), float(guidance[1:]),
                   image == ["image"])


@dataclass(frozen=True)
class RenderRequest:
    video_id: int
    prompt: str
    negative_prompt: str | None
    seed: int
    # A long video's later chunk (engine.long.chunks): clean latents (C, o, h, w, a torch tensor) its first o latent
    # frames are tied to. None for a video or a first chunk.
    condition: Any = field(default=None, compare=False, repr=False)
    # Return the latents, not decoded frames: a chunk whose video is stitched and decoded later.
    latents_only: bool = False
    # The picture the video starts from: uint8 (H, W, 3) at the batch's width and height, already fitted
    # (engine.frames.images.fit_image). None for a text-only video and for a long video's later chunks, which are tied
    # to the chunk before instead.
    image: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class RenderBatch:
    shape: Shape
    requests: tuple[RenderRequest, ...]


@dataclass(frozen=True)
class RenderedVideo:
    """One video's frames (uint8, F x H x W x 3) or the reason it has none: the engine's refusal of its output
    (engine.frames.checks.checked), an error whose class says what the worker does with the video (engine.errors)."""

    request: RenderRequest
    frames: np.ndarray | None
    error: RenderError | None = None
    # This video's share of the batch's seconds per stage: "text", "denoise", "decode".
    stages: dict[str, float] = field(default_factory=dict)
    # For a latents_only request: its latents (C, F, h, w), float32 on the CPU; frames is None.
    latents: Any = field(default=None, compare=False, repr=False)
    # For a stitched long video: engine.long.stitch.seam_score of its frames.
    seam_score: float | None = None
    # For a stitched long video: engine.frames.video_checks.seam_jump of its frames.
    seam_jump: float | None = None
    # How much of its initial noise its final latents kept (engine.loop.denoise.kept: 1 when the denoiser moved nothing,
    # NaN when they are not finite); a long video's, its last chunk's. None: not measured (diffusers' own loop).
    noise_kept: float | None = None


def stable_seed(*parts: object) -> int:
    """A seed from `parts` (joined by NUL, sha256, first 8 bytes, top bit cleared): the same on every machine and
    Python version (no hash()). A video's default seed and a long video's later chunks' seeds are drawn this way."""
    digest = hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def add_stages(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Seconds per stage, summed: a long video's chunks, or a render and its decode."""
    out = dict(total)
    for stage, seconds in more.items():
        out[stage] = out.get(stage, 0.0) + seconds
    return out


@dataclass(frozen=True)
class PictureInputs:
    """What WanImageToVideoPipeline adds to the loop, for a batch: each video's initial noise (B, C, F, h, w), its
    mask and picture latents (B, 4 + C, F, h, w) read beside the latents at every step, and the pictures' CLIP
    embeddings (B, n, d) for a transformer with `image_dim` (Wan 2.1 I2V), else None."""

    latents: torch.Tensor
    condition: torch.Tensor
    embeds: torch.Tensor | None
