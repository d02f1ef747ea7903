"""Pictures of the toy world beyond what its training drew: a user's pictures, drawn by the world's rules.

`toyworld.world` draws what the toy model was trained on: a shape 50-56% of the frame (16-18 px at 32x32) at a
whole-pixel position, in one of five exact palette colours, with hard edges. A user's picture of the same world
(one filled circle or square of a colour on a plain black or gray background, wrapped on the torus as the world
wraps) is unlikely to be any of those: its shape is smaller or larger, sits between pixels with anti-aliased edges,
and is another shade of its colour. This module draws such pictures, seeded:

- size: any real size in the given ranges (a side or diameter in pixels);
- position: the bounding box's corner anywhere on the torus, at sub-pixel precision;
- edges: each pixel takes the share of it the shape covers (SUPERSAMPLE x SUPERSAMPLE points), blended with the
  background, as a vector drawing rasterised with anti-aliasing is;
- colour: a shade at a CIELAB distance (CIE76, as the judge measures) in the given range from the palette colour,
  its direction drawn uniformly; the judge reads a shade up to toyworld.sight.SHADE_LIMIT (16) away as the palette
  colour and refuses one further.

`jobs.quality.images` draws its sets of unseen pictures from here; `toyworld.train_first_frame_vae` its training
pictures, with broader ranges and other seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toyworld.sight import lab
from toyworld.world import BACKGROUNDS, COLOURS, SHAPES

# Sample points per pixel side: 64 per pixel, so a pixel's coverage is exact to 1/64 (4 levels of 255 at most).
SUPERSAMPLE = 8
# The inverse of toyworld.sight.lab's sRGB-to-XYZ matrix and its white point (D65).
_XYZ_TO_SRGB = np.linalg.inv(np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]))
_D65 = np.array([0.95047, 1.0, 1.08883])


@dataclass(frozen=True)
class PictureSpec:
    colour: str  # the palette colour the shade is near: what a prompt names
    shape: str
    background: str
    size: float  # side of the square or diameter of the circle, in pixels
    x: float  # left edge of the bounding box, in pixels (0 is the frame's left edge)
    y: float  # top edge of the bounding box
    rgb: tuple[int, int, int]  # the shade drawn

    @property
    def delta_e(self) -> float:
        """CIELAB distance (CIE76) of the shade from its palette colour."""
        return float(np.linalg.norm(lab(np.array(self.rgb)) - lab(np.array(COLOURS[self.colour]))))


def srgb_from_lab(values: np.ndarray) -> np.ndarray:
    """CIELAB (D65, any leading shape) to sRGB 0-255 floats, unclipped: the inverse of toyworld.sight.lab."""
    values = np.asarray(values, dtype=np.float64)
    fy = (values[..., 0] + 16) / 116
    f = np.stack([fy + values[..., 1] / 500, fy, fy - values[..., 2] / 200], axis=-1)
    xyz = np.where(f > 6 / 29, f**3, 3 * (6 / 29) ** 2 * (f - 4 / 29)) * _D65
    c = xyz @ _XYZ_TO_SRGB.T
    c = np.where(c > 0.0031308, 1.055 * np.maximum(c, 0.0) ** (1 / 2.4) - 0.055, 12.92 * c)
    return c * 255.0


def shade_near(rng: np.random.Generator, colour: str, delta_e: tuple[float, float]) -> tuple[int, int, int]:
    """A uint8 sRGB shade whose CIELAB distance from the palette colour `colour` lies in `delta_e` (inclusive):
    a direction uniform on the sphere and a distance uniform in the range, redrawn until the rounded shade is in
    gamut and in range."""
    low, high = delta_e
    if not 0 <= low <= high:
        raise ValueError(f"delta_e must be (low, high) with 0 <= low <= high, got {delta_e}")
    centre = lab(np.array(COLOURS[colour], dtype=np.float64))
    for _ in range(1000):
        direction = rng.normal(size=3)
        direction /= np.linalg.norm(direction)
        rgb = np.rint(srgb_from_lab(centre + direction * rng.uniform(low, high)))
        if (rgb >= 0).all() and (rgb <= 255).all() and low <= np.linalg.norm(lab(rgb) - centre) <= high:
            return int(rgb[0]), int(rgb[1]), int(rgb[2])
    raise ValueError(f"no in-gamut shade of {colour} at CIELAB distance {low}-{high}")


def sample_picture(
    rng: np.random.Generator | int,
    *,
    width: int,
    height: int,
    sizes: tuple[tuple[float, float], ...],
    delta_e: tuple[float, float],
    colour: str | None = None,
    shape: str | None = None,
    background: str | None = None,
) -> PictureSpec:
    """A random picture: attributes not given drawn uniformly; a size uniform in one of `sizes` (each range
    chosen with the odds of its length); the corner uniform on the torus; a shade from shade_near."""
    rng = np.random.default_rng(rng)
    colour = colour or str(rng.choice(list(COLOURS)))
    shape = shape or str(rng.choice(SHAPES))
    background = background or str(rng.choice(list(BACKGROUNDS)))
    lengths = np.array([high - low for low, high in sizes], dtype=np.float64)
    if (lengths < 0).any() or lengths.sum() <= 0 or min(low for low, _ in sizes) < 1 \
            or max(high for _, high in sizes) >= min(width, height):
        raise ValueError(f"sizes must be ranges (low, high) within 1..{min(width, height)} px, got {sizes}")
    low, high = sizes[int(rng.choice(len(sizes), p=lengths / lengths.sum()))]
    size = float(rng.uniform(low, high))
    x, y = float(rng.uniform(0, width)), float(rng.uniform(0, height))
    return PictureSpec(colour, shape, background, size, x, y, shade_near(rng, colour, delta_e))


def coverage(shape: str, size: float, x: float, y: float, *, width: int, height: int) -> np.ndarray:
    """(H, W) float: the share of each pixel inside the shape, on the torus (toyworld.world.render_clip's rules at
    SUPERSAMPLE x SUPERSAMPLE points a pixel instead of one)."""
    offsets = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    u = np.mod((np.arange(width)[:, None] + offsets).ravel() - x, width)  # (W * S,) from the box's left edge
    v = np.mod((np.arange(height)[:, None] + offsets).ravel() - y, height)
    if shape == "square":
        inside = (v < size)[:, None] & (u < size)[None, :]
    elif shape == "circle":
        r = size / 2
        du = np.mod(u - r + width / 2, width) - width / 2  # from the centre, folded to the nearest copy
        dv = np.mod(v - r + height / 2, height) - height / 2
        inside = dv[:, None] ** 2 + du[None, :] ** 2 <= r * r
    else:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}; got {shape!r}")
    return inside.reshape(height, SUPERSAMPLE, width, SUPERSAMPLE).mean(axis=(1, 3))


def render_picture(spec: PictureSpec, *, width: int, height: int) -> np.ndarray:
    """The picture as uint8 (H, W, 3) RGB: the shade over the background, each pixel by its coverage."""
    if spec.background not in BACKGROUNDS or spec.colour not in COLOURS:
        raise ValueError(f"colour and background must be the world's; got {spec.colour!r}, {spec.background!r}")
    share = coverage(spec.shape, spec.size, spec.x, spec.y, width=width, height=height)[..., None]
    pixels = np.array(BACKGROUNDS[spec.background], dtype=np.float64) * (1 - share) \
        + np.array(spec.rgb, dtype=np.float64) * share
    return np.rint(pixels).astype(np.uint8)
