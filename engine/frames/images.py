"""Pictures a video starts from: bytes decoded and checked (never trusted by their name), then fitted to the video.

Pillow and numpy only, so the job system can check a manifest's images without loading torch. The engine encodes
the fitted pixels (engine.loop.first_frame); the job system reads the bytes (storage.inputs) and checks their SHA-256.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# Formats a manifest's image may be in, by what Pillow reads from the bytes (not the file's name).
FORMATS = ("PNG", "JPEG", "WEBP")
# Limits on one image (issue 21): bytes before anything is decoded, pixels a side before the pixels are.
MAX_IMAGE_BYTES = 64 * 2**20
MAX_IMAGE_SIDE = 8192
FITS = ("crop", "pad", "stretch")
# Pad colour: black, as a letterboxed frame (and the toy world's black background).
PAD_RGB = (0, 0, 0)


class ImageError(ValueError):
    """Bytes that are not an image reelbatch can start a video from; the message says why."""


def decode_image(data: bytes) -> np.ndarray:
    """uint8 (H, W, 3) RGB pixels of a PNG, JPEG or WebP image, turned upright by its EXIF orientation (a camera's
    portrait shot is stored sideways). ImageError for other bytes, a broken file, or a side over MAX_IMAGE_SIDE."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"is {len(data):,} bytes, over the {MAX_IMAGE_BYTES:,}-byte limit")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.format not in FORMATS:
                raise ImageError(f"is {image.format or 'not an image'} data; use {', '.join(FORMATS)}")
            width, height = image.size  # from the header: checked before any pixel is decoded
            if max(width, height) > MAX_IMAGE_SIDE:
                raise ImageError(f"is {width}x{height} px, over the {MAX_IMAGE_SIDE} px limit a side")
            image.load()
            image = ImageOps.exif_transpose(image)
            pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"is not a decodable image (not {', '.join(FORMATS)} data)") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for broken bytes; each is "not decodable"
        raise ImageError(f"is not a decodable image ({exc})") from None
    if pixels.shape[0] < 1 or pixels.shape[1] < 1:
        raise ImageError("has no pixels")
    return pixels


def fit_image(pixels: np.ndarray, width: int, height: int, fit: str) -> np.ndarray:
    """`pixels` (H, W, 3) uint8 at width x height: `crop` scales it to cover the frame and cuts the middle out,
    `pad` scales it to fit inside and fills the rest with black, `stretch` scales each side on its own. An image of
    the frame's size is returned unchanged whatever the fit (no resampling)."""
    if fit not in FITS:
        raise ValueError(f"fit must be one of {', '.join(FITS)}, got {fit!r}")
    h, w = pixels.shape[:2]
    if (w, h) == (width, height):
        return pixels
    image = Image.fromarray(pixels)
    if fit == "stretch":
        return _resized(image, width, height)
    # Scale so the image covers (crop) or fits inside (pad) the frame, keeping its aspect ratio.
    scale = (max if fit == "crop" else min)(width / w, height / h)
    sw, sh = max(1, round(w * scale)), max(1, round(h * scale))
    scaled = _resized(image, sw, sh)
    if fit == "crop":
        top, left = (sh - height) // 2, (sw - width) // 2
        return scaled[top : top + height, left : left + width]
    out = np.empty((height, width, 3), dtype=np.uint8)
    out[:] = PAD_RGB
    top, left = (height - sh) // 2, (width - sw) // 2
    out[top : top + sh, left : left + sw] = scaled
    return out


def _resized(image: Image.Image, width: int, height: int) -> np.ndarray:
    # Lanczos, as diffusers' VaeImageProcessor resizes a PIL image (its default resample).
    return np.asarray(image.resize((width, height), Image.Resampling.LANCZOS), dtype=np.uint8)
