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
_IMAGE_GAP = 8  # between the given picture and the video's frames
# Rows of the image sheet: 8 triples of the image set that between them show every colour, shape, direction and
# background (as default_prompts picks from the quality set).
SHEET_CASES = (0, 1, 2, 3, 12, 13, 14, 15)


def default_prompts() -> list[str]:
    """8 prompts that between them show every colour, shape, direction and background."""
    cases = sample_set(16)
    return [cases[i].prompt for i in (0, 1, 2, 3, 12, 13, 14, 15)]


def contact_sheet(settings: Settings, model: str, prompts: list[str], *, seed: int, steps: int | None, scale: int,
                  images: bool = False):
    """Render each prompt at the model's defaults (seeds seed, seed+1, ...) and lay out the decoded MP4 frames.
    `images`: instead, rows of the image set (SHEET_CASES, with their own seeds), each the given picture, then the
    frames of the video started from it."""
    registry = settings.registry()
    shape, fps = native_shape(registry, model, steps=steps)
    if images:
        from jobs.quality.images import image_set  # here, not at the top: the module loads the engine's VAE path

        cases = [image_set(shape.width, shape.height, max(SHEET_CASES) + 1)[i] for i in SHEET_CASES]
        requests = tuple(RenderRequest(i, c.prompt, None, c.seed, image=c.image) for i, c in enumerate(cases))
    else:
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
    lead = tile_w + _IMAGE_GAP if images else 0  # the picture's column
    width = lead + shape.frames * (tile_w + _GAP) - _GAP
    height = len(videos) * (_LABEL_H + tile_h + _GAP)
    sheet = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for row, (request, frames) in enumerate(zip(requests, videos)):
        top = row * (_LABEL_H + tile_h + _GAP)
        caption = f"{request.prompt} (seed {request.seed})"
        draw.text((1, top + 1), f"image | {caption}" if images else caption, fill=(0, 0, 0))
        if images:
            sheet.paste(Image.fromarray(_scaled(request.image, scale)), (0, top + _LABEL_H))
        for t, frame in enumerate(frames):
            sheet.paste(Image.fromarray(_scaled(frame, scale)), (lead + t * (tile_w + _GAP), top + _LABEL_H))
    return sheet


def _scaled(frame: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)
