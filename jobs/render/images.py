"""A claimed batch's images, read for its render: each image once per render whatever the number of videos naming
it, its bytes checked against the SHA-256 recorded at submit (never trusted by name or size), decoded and fitted to
the batch's size. Only a video's first chunk reads its image; a long video's later chunks are tied to the chunk
before. A video whose image cannot be read or has changed fails this attempt alone; the rest of the batch renders.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from engine.frames.images import MAX_IMAGE_BYTES, ImageError, decode_image, fit_image
from engine.types import RenderRequest, Shape
from jobs.claims.claims import ClaimedUnit
from storage.inputs import read_input
from storage.stores import StoreError


def attach_images(shape: Shape, pairs: list[tuple[RenderRequest, ClaimedUnit]]
                  ) -> tuple[list[tuple[RenderRequest, ClaimedUnit]], list[tuple[ClaimedUnit, str]]]:
    """The (request, unit) pairs with each first chunk's image attached, and the units whose image failed, with
    the error to record as their failed attempt."""
    read: dict[str, bytes | str] = {}  # URI -> its bytes, or why they could not be read
    decoded: dict[str, np.ndarray] = {}  # SHA-256 -> pixels
    ready, failed = [], []
    for request, unit in pairs:
        if unit.image_uri is None or unit.chunk > 0:
            ready.append((request, unit))
            continue
        if unit.image_uri not in read:
            read[unit.image_uri] = _read(unit.image_uri)
        data = read[unit.image_uri]
        if isinstance(data, str):
            failed.append((unit, data))
            continue
        try:
            if unit.image_sha256 not in decoded:
                decoded[unit.image_sha256] = _checked(unit.image_uri, data, unit.image_sha256)
        except ImageError as exc:
            failed.append((unit, str(exc)))
            continue
        pixels = fit_image(decoded[unit.image_sha256], shape.width, shape.height, unit.image_fit or "crop")
        ready.append((replace(request, image=pixels), unit))
    return ready, failed


def _read(uri: str) -> bytes | str:
    try:
        return read_input(uri, max_bytes=MAX_IMAGE_BYTES)
    except StoreError as exc:
        return f"cannot read the image: {exc}"


def _checked(uri: str, data: bytes, sha256: str | None) -> np.ndarray:
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ImageError(f"image {uri} changed since the run was submitted: its bytes hash to sha256 {actual}, the "
                         f"run recorded {sha256}; restore the image or submit the manifest again as a new run")
    try:
        return decode_image(data)
    except ImageError as exc:
        raise ImageError(f"image {uri} {exc}") from None
