"""The toy world and its judge: clips keep their prompts, and the judge reads them back, clean and through H.264."""

import dataclasses
from collections import Counter

import numpy as np
import pytest

from storage.encode import decode_frames, encode_mp4
from toyworld import ClipSpec, dataset, judge_clip, parse_prompt, render_clip, sample_spec, score
from toyworld.world import BACKGROUNDS, COLOURS, COMBINATIONS, DIRECTIONS, SHAPES, SIZE_RANGE

# (width, height, frames): the sizes and lengths the issue names, plus a wide frame and a short clip.
CONFIGS = [(32, 32, 9), (32, 32, 17), (64, 64, 9), (64, 64, 17)]
EXTRA = [(48, 32, 5), (32, 48, 9), (64, 32, 17)]
OTHER = {"colour": list(COLOURS), "shape": list(SHAPES), "direction": list(DIRECTIONS), "background": list(BACKGROUNDS)}


def round_trip(clip: np.ndarray) -> np.ndarray:
    return decode_frames(encode_mp4(clip, 8))  # crf 18, encode_mp4's default


def with_changed(prompt: str, attribute: str) -> str:
    """`prompt` with `attribute` swapped for the next value in its list: a prompt the clip does not keep."""
    values = dict(parse_prompt(prompt))
    choices = OTHER[attribute]
    values[attribute] = choices[(choices.index(values[attribute]) + 1) % len(choices)]
    return f"a {values['colour']} {values['shape']} moving {values['direction']} on a {values['background']} background"


def test_every_prompt_of_the_grammar_parses_back_and_others_do_not():
    assert len(COMBINATIONS) == 80
    for colour, shape, direction, background in COMBINATIONS:
        spec = ClipSpec(colour, shape, direction, background, size=10, x=0, y=0, speed=1)
        assert parse_prompt(spec.prompt) == dict(colour=colour, shape=shape, direction=direction, background=background)
    for text in [
        "a purple circle moving left on a black background",
        "a red triangle moving left on a black background",
        "a red circle moving sideways on a black background",
        "a red circle moving left on a white background",
        "a red circle moving left on a black background, 4k",
        "A red circle moving left on a black background",
        "",
    ]:
        assert parse_prompt(text) is None, text


@pytest.mark.parametrize("width, height", [(32, 32), (64, 64), (48, 32)])
def test_sample_spec_is_seeded_and_in_range(width, height):
    assert sample_spec(7, width=width, height=height) == sample_spec(7, width=width, height=height)
    specs = [sample_spec(np.random.default_rng(seed), width=width, height=height) for seed in range(300)]
    short = min(width, height)
    assert {s.size for s in specs} <= set(range(round(SIZE_RANGE[0] * short), round(SIZE_RANGE[1] * short) + 1))
    assert all(1 <= s.speed <= 3 for s in specs), "the shape must move at least 1 px per frame"
    assert all(0 <= s.x < width and 0 <= s.y < height for s in specs)
    assert len(set(specs)) > 250, "different seeds give different clips"
    fixed = sample_spec(1, width=width, height=height, colour="white", shape="square", direction="up")
    assert (fixed.colour, fixed.shape, fixed.direction) == ("white", "square", "up")


def test_render_clip_draws_exact_colours_and_is_deterministic():
    spec = sample_spec(3, width=64, height=64, colour="yellow", background="gray")
    clip = render_clip(spec, frames=9, width=64, height=64)
    assert clip.dtype == np.uint8 and clip.shape == (9, 64, 64, 3)
    assert {tuple(p) for p in clip.reshape(-1, 3)} == {COLOURS["yellow"], BACKGROUNDS["gray"]}
    assert np.array_equal(clip, render_clip(spec, frames=9, width=64, height=64))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_the_shape_moves_steadily_and_wraps_around(shape, direction):
    # Start across the corner so the very first frame is split over all four edges.
    spec = ClipSpec("red", shape, direction, "black", size=12, x=26, y=27, speed=2)
    clip = render_clip(spec, frames=40, width=32, height=32)  # 80 px of travel: more than twice round
    dx, dy = DIRECTIONS[direction]
    for t in range(39):  # every frame is the one before, shifted by the speed on the torus, nothing else
        assert np.array_equal(clip[t + 1], np.roll(clip[t], (2 * dy, 2 * dx), axis=(0, 1)))
    on = clip[0].any(axis=-1)
    assert on[0].any() and on[-1].any() and on[:, 0].any() and on[:, -1].any(), "frame 0 must straddle the edges"
    area = on.sum()
    assert all(frame.any(axis=-1).sum() == area for frame in clip), "wrapping never loses or adds a pixel"


def test_chunks_of_a_long_clip_join_up_exactly():
    spec = sample_spec(11, width=32, height=32)
    whole = render_clip(spec, frames=50, width=32, height=32)
    chunks = [render_clip(spec, frames=n, width=32, height=32, start=s) for s, n in [(0, 17), (17, 16), (33, 17)]]
    assert np.array_equal(np.concatenate(chunks), whole)


def test_dataset_cycles_through_every_prompt_evenly_and_is_seeded():
    pairs = list(dataset(200, 5, frames=3, width=32, height=32))
    counts = Counter(prompt for prompt, _ in pairs)
    assert len(counts) == 80 and set(Counter(prompt for prompt, _ in pairs[:160]).values()) == {2}
    assert max(counts.values()) - min(counts.values()) <= 1
    again = list(dataset(200, 5, frames=3, width=32, height=32))
    assert all(p == q and np.array_equal(a, b) for (p, a), (q, b) in zip(pairs, again))
    other = list(dataset(200, 6, frames=3, width=32, height=32))
    assert any(p != q or not np.array_equal(a, b) for (p, a), (q, b) in zip(pairs, other))


@pytest.mark.parametrize("width, height, frames", CONFIGS + EXTRA)
def test_judge_scores_every_clean_clip_right(width, height, frames):
    n = 160 if (width, height, frames) in CONFIGS else 80  # 2 (or 1) of each prompt, each with its own geometry
    result = score(dataset(n, 100 + frames, frames=frames, width=width, height=height))
    assert result.count == n
    assert (result.background, result.colour, result.shape, result.direction, result.all_four) == (1, 1, 1, 1, 1)


@pytest.mark.parametrize("width, height, frames", CONFIGS + EXTRA[:1])
def test_judge_scores_every_clip_right_after_an_mp4_round_trip(width, height, frames):
    clips = dataset(80, 200 + frames, frames=frames, width=width, height=height)
    pairs = [(prompt, round_trip(clip)) for prompt, clip in clips]
    result = score(pairs)
    assert result.count == 80 and result.all_four == 1.0, result
    for prompt, frames_ in pairs[:8]:
        assert np.hypot(*judge_clip(frames_).motion) > 0.95, "the judge sees at least 1 px per frame of motion"


@pytest.mark.parametrize("attribute", list(OTHER))
def test_judge_says_no_to_a_prompt_with_one_attribute_changed(attribute):
    pairs = list(dataset(80, 9, frames=9, width=32, height=32))
    result = score((with_changed(prompt, attribute), clip) for prompt, clip in pairs)
    assert getattr(result, attribute) == 0.0 and result.all_four == 0.0
    assert all(getattr(result, name) == 1.0 for name in OTHER if name != attribute)


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_an_object_crossing_the_edges_is_judged_right_before_and_after_encoding(direction):
    # Centred on the frame's corner at frame 0, so every frame of the first half is split across an edge.
    spec = ClipSpec("white", "circle", direction, "gray", size=12, x=26, y=26, speed=3)
    clip = render_clip(spec, frames=9, width=32, height=32)
    assert clip[0, 0, 0].tolist() == list(COLOURS["white"]), "the object must cover the corner pixel"
    for frames in (clip, round_trip(clip)):
        verdict = judge_clip(frames)
        assert verdict.matches(spec.prompt) == dict(colour=True, shape=True, direction=True, background=True), verdict
        dx, dy = DIRECTIONS[direction]
        assert np.allclose(verdict.motion, (3 * dx, 3 * dy), atol=0.5)
    square = dataclasses.replace(spec, shape="square", colour="blue")
    assert judge_clip(round_trip(render_clip(square, frames=9, width=32, height=32))).shape == "square"


def test_short_clips_and_a_single_frame():
    spec = ClipSpec("green", "square", "left", "black", size=10, x=30, y=5, speed=1)
    two = judge_clip(round_trip(render_clip(spec, frames=2, width=32, height=32)))
    assert two.matches(spec.prompt) == dict(colour=True, shape=True, direction=True, background=True)
    one = judge_clip(render_clip(spec, frames=1, width=32, height=32))
    assert (one.background, one.colour, one.shape, one.direction) == ("black", "green", "square", None)


def test_an_empty_frame_has_no_object_and_scores_only_its_background():
    empty = np.zeros((5, 32, 32, 3), dtype=np.uint8)
    verdict = judge_clip(empty)
    assert (verdict.background, verdict.colour, verdict.shape, verdict.direction) == ("black", None, None, None)
    result = score([("a red circle moving left on a black background", empty)])
    assert (result.count, result.background, result.colour, result.all_four) == (1, 1.0, 0.0, 0.0)
    assert score([]).count == 0


def test_loud_errors_at_the_edge():
    spec = ClipSpec("red", "circle", "left", "black", size=10, x=0, y=0, speed=1)
    with pytest.raises(ValueError, match="frames"):
        render_clip(spec, frames=0, width=32, height=32)
    with pytest.raises(ValueError, match="size"):
        render_clip(dataclasses.replace(spec, size=32), frames=1, width=32, height=32)
    with pytest.raises(ValueError, match="colour must be one of"):
        render_clip(dataclasses.replace(spec, colour="purple"), frames=1, width=32, height=32)
    with pytest.raises(ValueError, match="not in the toy grammar"):
        score([("a purple circle moving left on a black background", render_clip(spec, frames=2, width=32, height=32))])
    with pytest.raises(ValueError, match="uint8"):
        judge_clip(np.zeros((2, 32, 32, 3), dtype=np.float32))


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_seam_steps_see_a_chunk_that_restarts_the_motion(direction):
    """A 33-frame clip cut like a toy long video (seams at frames 9, 15, 21, 27, two frames a latent): drawn
    continuously, every seam step equals the steps inside (the speed); with each chunk restarting the motion 4
    frames back, the seams step backwards; jumping 4 frames ahead, they step far past the largest inside step."""
    from toyworld import seam_steps

    spec = dataclasses.replace(sample_spec(5, width=32, height=32, direction=direction), speed=2)
    seams = [9, 15, 21, 27]

    def clip(offset: int) -> np.ndarray:
        starts = [0, *seams, 33]
        return np.concatenate([render_clip(spec, frames=b - a, width=32, height=32, start=a + offset * k)
                               for k, (a, b) in enumerate(zip(starts, starts[1:]))])

    at_seams, inside = seam_steps(decode_frames(encode_mp4(clip(0), 8)), seams, 2, direction)
    assert len(at_seams) == 8 and len(inside) == 24
    assert np.allclose(at_seams, 2, atol=0.3) and np.allclose(inside, 2, atol=0.3)
    at_seams, inside = seam_steps(clip(-4), seams, 2, direction)
    assert np.allclose(inside, 2) and at_seams.min() < -5
    at_seams, inside = seam_steps(clip(4), seams, 2, direction)
    assert np.allclose(inside, 2) and at_seams.max() > 1.5 * inside.max()
