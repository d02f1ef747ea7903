"""A contact sheet: videos as rows of frames in one PNG, for a README or a quick look at a model."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from engine.types import RenderBatch, RenderRequest
from jobs.errors import UsageError
from jobs.quality.evaluate import gated_engine, native_shape, round_trip
from jobs.quality.sample import sample_set
from jobs.settings import Settings

_LABEL_H = 14  # px of caption above each row (PIL's built-in bitmap font is 11 px tall)
_GAP = 2


def default_prompts() -> list[str]:
    """8 prompts that between them show every colour, shape, direction and background."""
    cases = sample_set(16)
    return [cases[i].prompt for i in (0, 1, 2, 3, 12, 13, 14, 15)]


def contact_sheet(settings: Settings, model: str, prompts: list[str], *, seed: int, steps: int | None, scale: int):
    """Render each prompt at the model's defaults (seeds seed, seed+1, ...) and lay out the decoded MP4 frames."""
    registry = settings.registry()
    shape, fps = native_shape(registry, model, steps=steps)
    if not prompts or any(not p.strip() for p in prompts):
        raise UsageError("--prompt: prompts must not be empty")
    requests = tuple(RenderRequest(i, p, None, seed + i) for i, p in enumerate(prompts))
    rendered = gated_engine(settings, registry, model).render(RenderBatch(shape, requests))
    videos = []
    for video in rendered:
        if video.frames is None:
            raise UsageError(f"{video.request.prompt!r}: {video.error}")
        videos.append(round_trip(video.frames, fps))

    tile_w, tile_h = shape.width * scale, shape.height * scale
    width = shape.frames * (tile_w + _GAP) - _GAP
    height = len(videos) * (_LABEL_H + tile_h + _GAP)
    sheet = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for row, (request, frames) in enumerate(zip(requests, videos)):
        top = row * (_LABEL_H + tile_h + _GAP)
        draw.text((1, top + 1), f"{request.prompt} (seed {request.seed})", fill=(0, 0, 0))
        for t, frame in enumerate(frames):
            tile = np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)
            sheet.paste(Image.fromarray(tile), (t * (tile_w + _GAP), top + _LABEL_H))
    return sheet
