"""Read a toy-world clip back from its pixels and score how well it keeps its prompt.

The judge sees only decoded frames, as a viewer would, so it must survive H.264 (blurred edges, chroma at half
resolution, small colour shifts) and the toy world's wrap-around. Each attribute has one robust reading:

- background: the per-channel median of the whole clip (the shape covers at most a third of a frame), nearest
  background colour;
- colour: the median of the object's core (far-from-background pixels, eroded clear of blurred edges), nearest
  palette colour; none when that median is a visibly other shade (CIELAB distance over toyworld.sight.SHADE_LIMIT: a
  lime for a green) or when a frame's own core reads another palette colour (a red object that turns green);
- object: a soft mask, each pixel's share of object colour (its projection onto the background-to-object line),
  whose sums survive blur that would move a hard mask's edges by a pixel;
- shape: the object's fill ratio within its bounding box (a disc fills pi/4 = 0.785, a square 1.0), measured
  after rolling the frame so the object sits whole in the middle;
- direction: the centroid's step between frames, measured on the torus with circular means, summed over the clip;
- a clean background (reported beside the four, not one of them): the median CIELAB distance from the background
  colour of the pixels clear of the object, at most BACKGROUND_LIMIT (no tint, no blotches).

SHADE_LIMIT and BACKGROUND_LIMIT were set against hand labels (tests/fixtures/judge_labels.json, docs/QUALITY.md):
160 clips of `toy` and `toy-fast` on seeds nothing else used, each labelled blind (model hidden) against swatches
of the prompt's colour and background: does the object show the prompt's colour, is the background plain?
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from toyworld.sight import BG_NAMES, FG_NAMES, find, steps
from toyworld.world import ATTRIBUTES, DIRECTIONS, parse_prompt

# Side of the window kept around the object, as a share of the shorter frame side: the largest shape (56%, see
# toyworld.world.SIZE_RANGE) plus room for a pixel or two of blur on each side, so far-off specks do not count.
_WINDOW = 0.66
# Half-way between a disc's pi/4 and a square's 1.0. In trials, rasterised discs of 10-29 px filled 0.78-0.81 of
# their box clean and at most 0.83 after crf 18; squares filled 1.0 clean and at least 0.93 after.
_SQUARE_FILL = (np.pi / 4 + 1.0) / 2
# Median CIELAB distance from the background colour, over pixels at least 3 px clear of the object, beyond which the
# background is not plain (tinted or blotched). Agrees with 64 of the 80 hand-labelled gray backgrounds (the best of
# the medians, means and percentiles tried; black backgrounds were all labelled and read plain): a person forgives a
# bluish gray more than a yellow-green one, which no distance from gray tells apart.
BACKGROUND_LIMIT = 7.2


@dataclass(frozen=True)
class Verdict:
    background: str
    colour: str | None  # None (and shape, direction too) when no object is found
    shape: str | None
    direction: str | None  # None also for a single frame or a still object
    background_error: float  # RGB distance from the median pixel to the chosen background: small means sure
    colour_error: float  # RGB distance from the object's median colour to the chosen palette colour
    fill_ratio: float  # median over frames; far from _SQUARE_FILL means sure
    motion: tuple[float, float]  # mean centroid step (dx, dy) in px/frame, y downwards
    object_fraction: float  # mean share of the frame covered by the object
    colour_delta_e: float = float("nan")  # CIELAB distance from the object's median colour to its palette colour
    background_delta_e: float = float("nan")  # median CIELAB distance of the clear background from its colour

    @property
    def clean_background(self) -> bool:
        """Whether the background is plain: no tint or blotches a viewer would notice (BACKGROUND_LIMIT)."""
        return bool(self.background_delta_e <= BACKGROUND_LIMIT)

    def matches(self, prompt: str) -> dict[str, bool]:
        """Per attribute, whether this verdict agrees with `prompt`; raises ValueError for a prompt off the grammar."""
        wanted = parse_prompt(prompt)
        if wanted is None:
            raise ValueError(f"prompt is not in the toy grammar: {prompt!r}")
        return {name: getattr(self, name) == wanted[name] for name in ATTRIBUTES}


@dataclass(frozen=True)
class Scores:
    count: int
    background: float  # accuracy per attribute, in [0, 1]
    colour: float
    shape: float
    direction: float
    all_four: float  # share of clips with every attribute right
    clean_background: float = 0.0  # share of clips whose background is plain (Verdict.clean_background)
    right: tuple[bool, ...] = ()  # per clip, in order: every attribute right


def judge_clip(frames: np.ndarray) -> Verdict:
    """Recover background, colour, shape and direction from uint8 (F, H, W, 3) RGB frames."""
    found = find(frames)
    count, height, width, _ = frames.shape
    if found.mass is None:
        return Verdict(BG_NAMES[found.bg_index], None, None, None, found.background_error, found.colour_error,
                       np.nan, (0.0, 0.0), 0.0, found.colour_delta_e, found.background_delta_e)
    mass, cx, cy = found.mass, found.cx, found.cy
    areas = mass.sum(axis=(1, 2))

    # 5. Shape: roll each frame so the centroid sits mid-frame (the object is then whole, not split by an edge),
    # keep a window around it that holds the largest shape, and divide its area by its bounding box. The box
    # sides are the longest column and row sums: blur moves mass between neighbouring pixels but not out of a
    # column, so they stay whole-pixel accurate where a thresholded mask's edges would wander by a pixel.
    half = int(np.ceil(_WINDOW * min(height, width) / 2))
    fills = []
    for t in range(count):
        rolled = np.roll(mass[t], (height // 2 - int(round(cy[t])), width // 2 - int(round(cx[t]))), axis=(0, 1))
        local = rolled[height // 2 - half : height // 2 + half, width // 2 - half : width // 2 + half]
        fills.append(local.sum() / (local.sum(axis=0).max() * local.sum(axis=1).max()))
    fill_ratio = float(np.median(fills))
    shape = "square" if fill_ratio > _SQUARE_FILL else "circle"

    # 6. Direction: each step folded into [-W/2, W/2) (the shape moves far less than half a frame per frame),
    # summed over the clip; the larger axis and its sign name the direction.
    step_x, step_y = steps(found, width, height).T
    motion = (float(step_x.mean()), float(step_y.mean())) if count > 1 else (0.0, 0.0)
    total = np.array([step_x.sum(), step_y.sum()])
    direction = None
    if count > 1 and np.abs(total).max() >= 0.5:
        axis = int(np.argmax(np.abs(total)))
        unit = [0, 0]
        unit[axis] = int(np.sign(total[axis]))
        direction = next(name for name, step in DIRECTIONS.items() if list(step) == unit)

    return Verdict(
        background=BG_NAMES[found.bg_index],
        colour=None if found.fg_index is None else FG_NAMES[found.fg_index],
        shape=shape,
        direction=direction,
        background_error=found.background_error,
        colour_error=found.colour_error,
        fill_ratio=fill_ratio,
        motion=motion,
        object_fraction=float(areas.mean() / (height * width)),
        colour_delta_e=found.colour_delta_e,
        background_delta_e=found.background_delta_e,
    )


def score(pairs: Iterable[tuple[str, np.ndarray]]) -> Scores:
    """Judge each (prompt, frames) pair; accuracy per attribute and all four at once. An empty input scores 0."""
    hits = {name: 0 for name in ATTRIBUTES}
    clean = count = 0
    right = []
    for prompt, frames in pairs:
        verdict = judge_clip(frames)
        agree = verdict.matches(prompt)
        for name in ATTRIBUTES:
            hits[name] += agree[name]
        right.append(all(agree.values()))
        clean += verdict.clean_background
        count += 1
    share = (lambda k: k / count) if count else (lambda k: 0.0)
    return Scores(count=count, **{name: share(hits[name]) for name in ATTRIBUTES}, all_four=share(sum(right)),
                  clean_background=share(clean), right=tuple(right))


def object_steps(frames: np.ndarray) -> np.ndarray:
    """The object's centre step between consecutive frames, (F - 1, 2) as (dx, dy) px, y downwards, each folded
    into [-W/2, W/2) on the torus: how the object moves, frame by frame (a long video's seams are read with it).
    ValueError when no object is found."""
    found = find(frames)
    if found.mass is None:
        raise ValueError("no object found in the frames")
    height, width = frames.shape[1:3]
    return steps(found, width, height)


def seam_steps(frames: np.ndarray, seams: list[int], span: int, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """The object's steps along `direction` (px per frame, positive forward) at a long video's seams and inside its
    chunks. A seam at frame s is the steps into and through the first latent a chunk adds, s - 1 .. s + span - 2
    (`span`: the VAE's temporal factor, frames per latent). Continuous motion has seam steps like the inside ones;
    a chunk that restarts the motion shows a jump (or a step backwards) there."""
    unit = np.array(DIRECTIONS[direction], dtype=np.float64)
    along = object_steps(frames) @ unit
    at_seam = np.zeros(len(along), dtype=bool)
    for s in seams:
        at_seam[max(s - 1, 0) : s + span - 1] = True
    return along[at_seam], along[~at_seam]
