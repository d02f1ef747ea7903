"""What a registered model can render, as a manifest's checks ask it: a side of so many pixels (its folder's grid and
rotary positions, engine.models.shape_rules) and a duration's frames (its frame grid, then chunks of its window)."""

from __future__ import annotations

import math

from engine.models.registry import MAX_CHUNKS, ModelInfo
from jobs.manifest.values import FieldError


def side_problem(model: ModelInfo | None, side: str, n: int) -> str | None:
    """Why `model` cannot render a `side` of `n` pixels (engine.models.shape_rules: its folder's grid and rotary
    positions), as the words after the value; None if it can."""
    if model is None:
        return None
    if model.rules is not None:
        return model.rules.side_problem(model.name, side, n, model.spatial_multiple)
    return f"is not a multiple of {model.spatial_multiple}" if n % model.spatial_multiple else None


def plan_frames(model: ModelInfo, duration_s: float, fps: int) -> int:
    """The frame count the model renders for a requested duration: nearest whole frame, then the model's grid.
    Beyond the model's window the video is rendered in chunks (engine.long.chunks), up to MAX_CHUNKS of them."""
    # Half-up, like ModelInfo.valid_frames, not Python's round-half-even.
    frames = model.valid_frames(math.floor(duration_s * fps + 0.5))
    plan = model.chunk_plan(frames)
    chunks = plan.chunks
    if chunks > MAX_CHUNKS:
        latents = plan.window_latents + (MAX_CHUNKS - 1) * (plan.window_latents - plan.overlap)
        longest = 1 + (latents - 1) * model.temporal_factor
        raise FieldError(
            f"{duration_s:g} s at {fps} fps is {frames} frames, {chunks} chunks of {model.name}'s {model.max_frames}-"
            f"frame window; at most {MAX_CHUNKS} chunks ({longest} frames), so at most {longest / fps:g} s at {fps} fps"
        )
    return frames
