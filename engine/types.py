"""Plain values passed between the job system and the engine. No ORM rows cross this line."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Shape:
    """Everything that must match for videos to share one pipeline call."""

    model: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float

    def key(self) -> str:
        """A stable text form, stored on work units so the database can group same-shape work."""
        return f"{self.model}|{self.width}x{self.height}|f{self.frames}|s{self.steps}|g{self.guidance:g}"


@dataclass(frozen=True)
class RenderRequest:
    video_id: int
    prompt: str
    negative_prompt: str | None
    seed: int


@dataclass(frozen=True)
class RenderBatch:
    shape: Shape
    requests: tuple[RenderRequest, ...]


@dataclass(frozen=True)
class RenderedVideo:
    """One video's frames (uint8, F x H x W x 3) or the reason it has none."""

    request: RenderRequest
    frames: np.ndarray | None
    error: str | None = None
    # This video's share of the batch's seconds per stage: "text", "denoise", "decode".
    stages: dict[str, float] = field(default_factory=dict)
