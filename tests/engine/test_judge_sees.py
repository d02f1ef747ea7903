"""The toy judge reads what a person sees: an object in another shade of its colour (a lime for a green), an object
that changes colour, and a tinted or blotched background are failures, as the hand labels call them.

CIELAB distances quoted below were taken with LittleCMS (PIL.ImageCms, sRGB to Lab D65), not with the judge's own
conversion."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from toyworld import ClipSpec, judge_clip, render_clip, score
from toyworld.judge import BACKGROUND_LIMIT
from toyworld.sight import SHADE_LIMIT

LABELS = Path(__file__).resolve().parents[1] / "fixtures" / "judge_labels"
GREEN = ClipSpec("green", "square", "right", "gray", size=16, x=4, y=8, speed=2)


def recoloured(spec: ClipSpec, rgb: tuple[int, int, int], frames: slice = slice(None)) -> np.ndarray:
    """`spec`'s clip with the object's pixels painted `rgb` in `frames`."""
    clip = render_clip(spec, frames=9, width=32, height=32)
    from toyworld.world import COLOURS

    obj = (clip == np.array(COLOURS[spec.colour], dtype=np.uint8)).all(axis=-1)
    obj[np.setdiff1d(np.arange(len(clip)), np.arange(len(clip))[frames])] = False
    clip[obj] = rgb
    return clip


def test_a_lime_object_is_not_the_prompts_green_and_a_near_green_is():
    # Palette green (100, 230, 90) to (150, 215, 80): 20.4 in CIELAB, a lime a viewer names apart; to (105, 225, 95):
    # 4.4, the same green.
    lime = judge_clip(recoloured(GREEN, (150, 215, 80)))
    assert lime.colour is None and lime.colour_delta_e == pytest.approx(20.4, abs=1.0)
    assert (lime.shape, lime.direction, lime.background) == ("square", "right", "gray")  # the rest is still read
    assert lime.matches(GREEN.prompt) == dict(colour=False, shape=True, direction=True, background=True)
    near = judge_clip(recoloured(GREEN, (105, 225, 95)))
    assert near.colour == "green" and near.colour_delta_e == pytest.approx(4.4, abs=1.0)
    assert SHADE_LIMIT == 16.0


def test_an_object_that_changes_colour_has_no_colour():
    white = dataclasses.replace(GREEN, colour="white")
    # Frames 0 and 1 of nine yellow, the rest white: the clip's median is white, its first frames are not. Yellow
    # still lies 0.29 of the way from gray to white (102*112 + 82*112 - 88*112 over 3 * 112**2), so the object is
    # found in every frame and its shape and motion are read.
    turning = judge_clip(recoloured(white, (230, 210, 40), slice(0, 2)))
    assert turning.colour is None and turning.shape == "square" and turning.direction == "right"
    assert judge_clip(render_clip(white, frames=9, width=32, height=32)).colour == "white"


def test_a_blotched_or_tinted_background_is_not_clean():
    clean = render_clip(GREEN, frames=9, width=32, height=32)
    assert judge_clip(clean).background_delta_e == 0.0 and judge_clip(clean).clean_background
    # A faint tint, (128, 132, 128): 3.1 from gray, under the limit.
    faint = clean.copy()
    faint[(clean == 128).all(axis=-1)] = (128, 132, 128)
    assert judge_clip(faint).clean_background
    assert judge_clip(faint).background_delta_e == pytest.approx(3.1, abs=0.5)
    # A red mesh, (160, 100, 100): 27.7 from gray, over two of every three 2x2 blocks of the background.
    mesh = (np.arange(32)[:, None] // 2 + np.arange(32)[None, :] // 2) % 3 != 0
    blotched = clean.copy()
    blotched[(clean == 128).all(axis=-1) & mesh] = (160, 100, 100)
    verdict = judge_clip(blotched)
    assert verdict.background == "gray" and not verdict.clean_background  # still a gray scene, not a plain one
    assert verdict.background_delta_e > BACKGROUND_LIMIT == 7.2


def test_the_judge_agrees_with_the_hand_labels():
    meta = json.loads((LABELS / "labels.json").read_text())
    frames = np.load(LABELS / "clips.npz")["frames"]
    labels = meta["labels"]
    assert len(labels) == len(frames) == 160
    colour = background = lime_caught = 0
    for row, clip in zip(labels, frames):
        verdict = judge_clip(clip)
        wanted = row["prompt"].split()[1]
        colour += (verdict.colour == wanted) == (row["colour"] == "y")
        background += verdict.clean_background == (row["background"] == "y")
        lime_caught += row["colour"] == "n" and verdict.colour != wanted
    # Of 160 labels: 154 colour verdicts agree, 144 background verdicts (all 80 black backgrounds, 64 of 80 gray).
    # Floors, a few under: the thresholds were set on these labels (a training figure, docs/QUALITY.md).
    assert colour >= 150 and background >= 140
    # The failure cases: 16 clips labelled another shade (all of them toy-fast's), 15 read as such.
    assert sum(row["colour"] == "n" for row in labels) == 16 and lime_caught >= 14
    by_model = {m: score((r["prompt"], c) for r, c in zip(labels, frames) if r["model"] == m) for m in ("toy",
                                                                                                       "toy-fast")}
    assert by_model["toy"].colour > by_model["toy-fast"].colour + 0.1
