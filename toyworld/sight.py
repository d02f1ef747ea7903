"""What a toy-world clip's pixels show, read as the judge (toyworld.judge) needs them: the background colour, the
object's colour and soft mask, and its centre in every frame, robust to H.264 and the world's wrap-around. The judge
turns these readings into a verdict on the prompt's attributes; a long video's seams are read from the same centres.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toyworld.world import BACKGROUNDS, COLOURS

BG_NAMES, _BG_RGB = list(BACKGROUNDS), np.array(list(BACKGROUNDS.values()), dtype=np.float64)
FG_NAMES, _FG_RGB = list(COLOURS), np.array(list(COLOURS.values()), dtype=np.float64)


# A pixel is a candidate object pixel when it is this far (Euclidean RGB) from the background. Palette colours
# sit >= 110 from both backgrounds; H.264 ringing at crf 18 stays well under 60.
_CANDIDATE = 60.0
# Projections onto the background-to-object line below this count as background, above 1 - _RAMP as object.
_RAMP = 0.25
# CIELAB distance (CIE76) from the palette colour beyond which the object is another shade, not the prompt's colour.
# On the 160 hand-labelled clips the readings agreed with the labels for 154 at 16 (153 at 15 and 18, 150 at 20):
# the labelled-wrong greens of toy-fast sat at 18-32, the teacher's objects at most 12 from their palette colour.
SHADE_LIMIT = 16.0
# A frame takes part in the colour's per-frame check when its object core has at least this many pixels.
_FRAME_CORE = 4
_CLEAR = 3


@dataclass(frozen=True)
class Found:
    """What steps 1-4 of toyworld.judge.judge_clip read: the background and object colour, the object's soft mask and
    its centre in every frame; mass (and the centres) are None when no object was found."""

    bg_index: int
    background_error: float
    fg_index: int | None  # None also when the colour is another shade or changes between frames
    colour_error: float
    colour_delta_e: float
    background_delta_e: float
    mass: np.ndarray | None  # (F, H, W) in [0, 1]
    cx: np.ndarray | None  # (F,)
    cy: np.ndarray | None


def find(frames: np.ndarray) -> Found:
    """The readings of uint8 (F, H, W, 3) RGB frames (ValueError for anything else): steps 1-4 of the judge."""
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 (F, H, W, 3), got {getattr(frames, 'shape', type(frames))}")
    count, height, width, _ = frames.shape
    if count < 1:
        raise ValueError("frames must hold at least one frame")
    pixels = frames.astype(np.float64)

    # 1. Background: the median pixel, nearest background colour.
    median = np.median(pixels.reshape(-1, 3), axis=0)
    bg_index, background_error = _nearest(median, _BG_RGB)
    bg = _BG_RGB[bg_index]

    # 2. Object colour: candidates are far from the background; the core is what is left after eroding them by
    # 2 px, clear of the edge pixels whose chroma H.264 averaged with the background's.
    candidates = np.linalg.norm(pixels - bg, axis=-1) > _CANDIDATE
    if not candidates.any():
        return Found(bg_index, background_error, None, np.inf, np.inf, _background_delta_e(pixels, bg, None),
                      None, None, None)
    core = _erode(candidates, 2)
    if not core.any():  # an object thinner than 5 px: its edges are all there is
        core = candidates
    obj = np.median(pixels[core], axis=0)
    fg_index, colour_error = _nearest(obj, _FG_RGB)
    colour_delta_e = float(np.linalg.norm(lab(obj) - lab(_FG_RGB[fg_index])))
    per_frame = [_nearest(np.median(pixels[t][core[t]], axis=0), _FG_RGB)[0]
                 for t in range(count) if core[t].sum() >= _FRAME_CORE]
    colour_index = fg_index if colour_delta_e <= SHADE_LIMIT and all(i == fg_index for i in per_frame) else None

    # 3. Object mass: each pixel's position along the line from the background to the observed object colour
    # (the observed colour, not the palette's, so colour shifts do not move the cut), ramped to [0, 1]. The ramp is
    # symmetric about 0.5, so a blurred edge keeps its total mass, while faint ringing (< _RAMP) counts nothing.
    line = obj - bg
    along = (pixels - bg) @ line / (line @ line)
    mass = np.clip((along - _RAMP) / (1 - 2 * _RAMP), 0.0, 1.0)  # (F, H, W)
    if (mass.sum(axis=(1, 2)) < 1.0).any():
        return Found(bg_index, background_error, None, np.inf, np.inf, _background_delta_e(pixels, bg, None),
                      None, None, None)

    # 4. Centroid per frame with circular statistics: a shape split across an edge averages to its true centre.
    cx = _circular_centre(mass.sum(axis=1), width)  # (F,) from column sums
    cy = _circular_centre(mass.sum(axis=2), height)
    return Found(bg_index, background_error, colour_index, colour_error, colour_delta_e,
                  _background_delta_e(pixels, bg, mass > 0), mass, cx, cy)


def steps(found: Found, width: int, height: int) -> np.ndarray:
    return np.stack([fold(np.diff(found.cx), width), fold(np.diff(found.cy), height)], axis=1)


def lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB (0-255, any leading shape, last axis RGB) to CIELAB under D65: the standard sRGB transfer curve and
    matrix, then CIE 1976 L*a*b*. Distances in it (CIE76) track what a viewer sees as a colour difference far
    better than RGB distances do."""
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = c @ _SRGB_TO_XYZ.T / _D65
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


_SRGB_TO_XYZ = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
_D65 = np.array([0.95047, 1.0, 1.08883])


def _background_delta_e(pixels: np.ndarray, bg: np.ndarray, object_mask: np.ndarray | None) -> float:
    """Median CIELAB distance from `bg` of the pixels at least _CLEAR px from any object pixel (all pixels when no
    object was found); inf when none are that clear."""
    clear = np.ones(pixels.shape[:3], dtype=bool) if object_mask is None else _erode(~object_mask, _CLEAR)
    if not clear.any():
        return float("inf")
    return float(np.median(np.linalg.norm(lab(pixels[clear]) - lab(bg), axis=-1)))


def _nearest(rgb: np.ndarray, palette: np.ndarray) -> tuple[int, float]:
    distances = np.linalg.norm(palette - rgb, axis=1)
    index = int(np.argmin(distances))
    return index, float(distances[index])


def _erode(mask: np.ndarray, radius: int) -> np.ndarray:
    """Erode (F, H, W) masks with a (2r+1)-square on the torus: a pixel stays if its whole neighbourhood is set."""
    out = mask.copy()
    for axis in (1, 2):
        source = out.copy()
        for shift in range(-radius, radius + 1):
            out &= np.roll(source, shift, axis=axis)
    return out


def _circular_centre(weights: np.ndarray, period: int) -> np.ndarray:
    """Per row of `weights` (F, period), the weighted circular mean position of pixel centres, in [0, period)."""
    angles = 2 * np.pi * (np.arange(period) + 0.5) / period
    phase = np.angle(weights @ np.exp(1j * angles))
    return np.mod(phase * period / (2 * np.pi) - 0.5, period)


def fold(steps: np.ndarray, period: int) -> np.ndarray:
    """Steps on a circle of `period`, folded into [-period/2, period/2)."""
    return np.mod(steps + period / 2, period) - period / 2
