"""A procedural toy world: one filled shape sliding across a plain background, with a prompt that says what it is.

Prompts follow one grammar, `a {colour} {shape} moving {direction} on a {background} background`, small enough
(80 sentences) for a tiny model to learn and for `toyworld.judge` to check from pixels alone. The frame is a
torus: the shape wraps around the edges, so a clip of any length, rendered in one go or in chunks, keeps its
prompt true. Everything is numpy and deterministic from a seed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

# Exact RGB values. H.264 in yuv420p keeps luma at full resolution but chroma at half, so an edge that differs
# from the background only in chroma comes back smeared over 2-px blocks. Every colour therefore differs from
# both backgrounds in BT.709 luma by >= 60 (red 68, green 192, blue 67, yellow 202, white 240; gray is 128), as
# well as by >= 110 in RGB from the backgrounds and from each other, so a colour is never mistaken for another.
# White is 240, not 255, so limited-range YUV round trips do not clip it.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (210, 30, 30),
    "green": (100, 230, 90),
    "blue": (40, 60, 210),
    "yellow": (230, 210, 40),
    "white": (240, 240, 240),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {"black": (0, 0, 0), "gray": (128, 128, 128)}
SHAPES = ("circle", "square")
# Unit steps in image coordinates: x grows rightwards, y grows downwards, so "up" is -y.
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}

ATTRIBUTES = ("colour", "shape", "direction", "background")
# Every prompt of the grammar, in a fixed order: colour, shape, direction, background (80 in all).
COMBINATIONS: tuple[tuple[str, str, str, str], ...] = tuple(
    itertools.product(COLOURS, SHAPES, DIRECTIONS, BACKGROUNDS)
)

_PROMPT = re.compile(
    rf"a ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)}) moving ({'|'.join(DIRECTIONS)}) "
    rf"on a ({'|'.join(BACKGROUNDS)}) background"
)

# Shape size as a fraction of the shorter frame side: 16-18 px at the toy's 32x32, 4-4.5 cells of its VAE's 4x
# latent grid. What tells a circle from a square is its corners (a disc fills pi/4 of its box), and a VAE rounds
# corners by a few pixels whatever the size, so larger shapes keep more of the difference: the run-4 VAE (trained
# on 13-15 px) gave back 13 px squares as squares in 62% of clips and 17-18 px squares in 95-97% (docs/TOY_TRAINING.md).
# Below 10 px yuv420p's 2x2 chroma blocks blur a disc towards a square (its fill ratio rose from 0.81 to 0.87 at
# 8 px; a square's stays >= 0.93). Any size below the frame keeps the position unambiguous on the torus: the
# circular mean of an arc shorter than the circle is its middle.
SIZE_RANGE = (0.50, 0.56)
# Integer px/frame: at least 1 so the motion is visible in every frame pair, whole pixels so the shape is the
# same raster in every frame (a pure translation), and at most 3 so a 32-px frame is crossed in no fewer than
# ~10 frames and the frame-to-frame step stays far below half the frame (needed to read direction on a torus).
SPEED_RANGE = (1, 3)


@dataclass(frozen=True)
class ClipSpec:
    colour: str
    shape: str
    direction: str
    background: str
    size: int  # side of the square or diameter of the circle, in pixels
    x: float  # left edge of the shape's bounding box at frame 0 (sample_spec draws whole pixels)
    y: float  # top edge of the bounding box at frame 0
    speed: float  # pixels per frame along `direction`

    @property
    def prompt(self) -> str:
        return f"a {self.colour} {self.shape} moving {self.direction} on a {self.background} background"


def parse_prompt(text: str) -> dict[str, str] | None:
    """The four attributes of a prompt in the grammar, or None for any other text (only outer spaces are forgiven)."""
    match = _PROMPT.fullmatch(text.strip())
    return None if match is None else dict(zip(ATTRIBUTES, match.groups()))


def sample_spec(
    rng: np.random.Generator | int,
    *,
    width: int,
    height: int,
    colour: str | None = None,
    shape: str | None = None,
    direction: str | None = None,
    background: str | None = None,
) -> ClipSpec:
    """A random clip: attributes not given are drawn uniformly; size, start position and speed always are."""
    rng = np.random.default_rng(rng)
    _check_frame(width, height)
    colour = colour or str(rng.choice(list(COLOURS)))
    shape = shape or str(rng.choice(SHAPES))
    direction = direction or str(rng.choice(list(DIRECTIONS)))
    background = background or str(rng.choice(list(BACKGROUNDS)))
    _check_attributes(colour, shape, direction, background)
    short = min(width, height)
    low, high = round(SIZE_RANGE[0] * short), round(SIZE_RANGE[1] * short)
    size = int(rng.integers(low, high + 1))
    # Any start is valid on a torus: a shape that begins across an edge is simply drawn split.
    x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
    speed = int(rng.integers(SPEED_RANGE[0], SPEED_RANGE[1] + 1))
    return ClipSpec(colour, shape, direction, background, size, x, y, speed)


def render_clip(spec: ClipSpec, *, frames: int, width: int, height: int, start: int = 0) -> np.ndarray:
    """Draw frames start .. start + frames - 1 of the clip as uint8 (F, H, W, 3) RGB. Frame t shows the shape moved
    t * speed pixels and wrapped around, so consecutive chunks of a long clip join up exactly."""
    _check_frame(width, height)
    _check_attributes(spec.colour, spec.shape, spec.direction, spec.background)
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)) or frames < 1:
        raise ValueError(f"frames must be an integer >= 1, got {frames!r}")
    if not 1 <= spec.size < min(width, height):
        raise ValueError(f"size must be in 1..{min(width, height) - 1} for a {width}x{height} frame, got {spec.size}")
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"start must be an integer >= 0, got {start!r}")
    if spec.speed < 0:
        raise ValueError(f"speed must be >= 0, got {spec.speed}")
    dx, dy = DIRECTIONS[spec.direction]
    t = np.arange(start, start + frames, dtype=np.float64)
    left = spec.x + dx * spec.speed * t  # (F,) bounding-box corner per frame, not yet wrapped
    top = spec.y + dy * spec.speed * t
    # Offset of every pixel centre from the bounding box corner, taken modulo the frame: this is drawing on a
    # torus, so a shape crossing an edge comes back split on the opposite side with no special case.
    u = np.mod(np.arange(width) + 0.5 - left[:, None], width)  # (F, W), in [0, W)
    v = np.mod(np.arange(height) + 0.5 - top[:, None], height)  # (F, H)
    if spec.shape == "square":
        mask = (v < spec.size)[:, :, None] & (u < spec.size)[:, None, :]
    else:
        r = spec.size / 2
        # Signed distance from the centre, folded into (-W/2, W/2] so the nearest copy of the centre counts.
        du = np.mod(u - r + width / 2, width) - width / 2
        dv = np.mod(v - r + height / 2, height) - height / 2
        mask = dv[:, :, None] ** 2 + du[:, None, :] ** 2 <= r * r
    clip = np.empty((frames, height, width, 3), dtype=np.uint8)
    clip[:] = BACKGROUNDS[spec.background]
    clip[mask] = COLOURS[spec.colour]
    return clip


def dataset(n: int, seed: int, *, frames: int, width: int, height: int) -> Iterator[tuple[str, np.ndarray]]:
    """`n` (prompt, clip) pairs. Each run of 80 holds every prompt once, in a seeded shuffle, so any prefix of
    length 80k is exactly balanced and shorter prefixes are as close to balanced as they can be."""
    for spec in dataset_specs(n, seed, width=width, height=height):
        yield spec.prompt, render_clip(spec, frames=frames, width=width, height=height)


def dataset_specs(n: int, seed: int, *, width: int, height: int) -> Iterator[ClipSpec]:
    """The specs `dataset` draws and renders, for callers that need more than the pixels (the other shape's mask)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = np.random.default_rng(seed)
    order: np.ndarray = np.empty(0, dtype=np.int64)
    for i in range(n):
        if i % len(COMBINATIONS) == 0:
            order = rng.permutation(len(COMBINATIONS))
        colour, shape, direction, background = COMBINATIONS[order[i % len(COMBINATIONS)]]
        yield sample_spec(
            rng, width=width, height=height, colour=colour, shape=shape, direction=direction, background=background
        )


def _check_frame(width: int, height: int) -> None:
    # 16 px is the least where the smallest shape (40%) is still 6 px across; the judge is tested from 32 px.
    if width < 16 or height < 16:
        raise ValueError(f"frame must be at least 16x16, got {width}x{height}")


def _check_attributes(colour: str, shape: str, direction: str, background: str) -> None:
    for name, value, allowed in (
        ("colour", colour, COLOURS),
        ("shape", shape, SHAPES),
        ("direction", direction, DIRECTIONS),
        ("background", background, BACKGROUNDS),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
