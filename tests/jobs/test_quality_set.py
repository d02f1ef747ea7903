"""The quality sample set and the reference comparison, without rendering."""

import numpy as np

from engine.types import Shape
from jobs.quality.evaluate import REFERENCE_PSNR_DB, compare_references, save_references
from jobs.quality.sample import Case, sample_set
from toyworld.world import ATTRIBUTES, BACKGROUNDS, COLOURS, DIRECTIONS, SHAPES, parse_prompt

VALUES = {"colour": set(COLOURS), "shape": set(SHAPES), "direction": set(DIRECTIONS), "background": set(BACKGROUNDS)}


def test_the_sample_set_holds_every_prompt_once_and_is_fixed():
    cases = sample_set(80)
    assert len({c.prompt for c in cases}) == 80
    assert len({c.seed for c in cases}) == 80
    assert all(parse_prompt(c.prompt) for c in cases)
    assert sample_set(80) == cases and sample_set(16) == cases[:16]


def test_every_16_consecutive_cases_cover_every_attribute_value():
    cases = sample_set(160)
    for start in range(0, 160 - 16 + 1):
        seen = [parse_prompt(c.prompt) for c in cases[start : start + 16]]
        for name in ATTRIBUTES:
            assert {s[name] for s in seen} == VALUES[name], (start, name)


SHAPE = Shape("toy", 16, 16, 3, 20, 5.0)


def videos(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8) for _ in range(n)]


def test_identical_renders_match_their_references(tmp_path):
    cases, frames = sample_set(4), videos(4)
    save_references(tmp_path / "r.npz", SHAPE, cases, frames)
    result = compare_references(tmp_path / "r.npz", SHAPE, cases[1:3], frames[1:3])
    assert result["available"] and result["matches"]
    assert result["psnr_db_min"] == 100.0 and result["ssim_min"] == 1.0


def test_a_drifted_render_is_caught(tmp_path):
    cases, frames = sample_set(4), videos(4)
    save_references(tmp_path / "r.npz", SHAPE, cases, frames)
    drifted = [f.copy() for f in frames]
    drifted[2] = np.clip(drifted[2].astype(int) + 6, 0, 255).astype(np.uint8)  # about 32 dB
    result = compare_references(tmp_path / "r.npz", SHAPE, cases, drifted)
    assert result["available"] and not result["matches"]
    assert result["psnr_db_min"] < REFERENCE_PSNR_DB < result["psnr_db_mean"]


def test_references_of_another_shape_or_case_are_not_compared(tmp_path):
    cases, frames = sample_set(4), videos(4)
    save_references(tmp_path / "r.npz", SHAPE, cases, frames)
    other = Shape("toy", 16, 16, 3, 10, 5.0)
    assert "10 steps" not in compare_references(tmp_path / "r.npz", other, cases, frames)["why"]
    assert "20 steps" in compare_references(tmp_path / "r.npz", other, cases, frames)["why"]
    unknown = [Case(cases[0].prompt, 1)]
    assert "no reference" in compare_references(tmp_path / "r.npz", SHAPE, unknown, frames[:1])["why"]
    assert compare_references(tmp_path / "none.npz", SHAPE, cases, frames)["available"] is False
