"""The reference-free checks on small synthetic videos made bad on purpose, each value worked out by hand.

Every video is 16x16 (so the motion check's blocks are single pixels: 16 // 16 = 1) on a gray 128 background; a
"square" is a 4x4 block of white 240. BT.709's luma weights add up to 1, so a gray pixel's luma is its level.
The structure check is off for those (NO_STRUCTURE): a 16x16 picture of a 4x4 square is too few pixels for its
correlations, and it has tests of its own below.
"""

import numpy as np
import pytest

from engine.frames.video_checks import Thresholds, check_video, seam_jump, structure

NO_STRUCTURE = Thresholds(min_structure=0.0)

GRAY, WHITE = 128, 240


def frames(n: int) -> np.ndarray:
    return np.full((n, 16, 16, 3), GRAY, dtype=np.uint8)


def square_at(video: np.ndarray, t: int, x: int) -> None:
    video[t, 0:4, x:x + 4] = WHITE


def verdicts(checks) -> dict[str, bool]:
    return {c.name: c.passed for c in checks.all()}


def test_an_all_black_video_is_blank_frozen_and_still():
    checks = check_video(np.zeros((5, 16, 16, 3), dtype=np.uint8), NO_STRUCTURE)
    # Every frame black: 5 of 5 blank. Every step 0: one stretch of all 5 frames. No change from frame 0.
    assert (checks.blank.value, checks.frozen.value, checks.flicker.value, checks.motion.value) == (1.0, 1.0, 0.0, 0.0)
    assert verdicts(checks) == {"blank": False, "frozen": False, "flicker": True, "motion": False}
    assert checks.reason() == "blank 1 > 0.5; frozen 1 > 0.5; motion 0 < 4"


def test_a_video_frozen_after_its_second_frame_is_frozen():
    video = frames(5)
    square_at(video, 0, 0)
    for t in range(1, 5):
        square_at(video, t, 2)  # moved 2 px, then never again
    checks = check_video(video, NO_STRUCTURE)
    # Step 0->1: columns 0-1 turn gray and 4-5 white, 4 rows: 16 pixels x 3 channels x 112 levels over 768 values = 7;
    # steps 1->2, 2->3, 3->4: 0. Frozen: frames 1-4, 4 of 5 = 0.8. Flicker: (7 + 0 + 0 + 0) / 4 = 1.75.
    # Motion: 16 of 256 luma pixels 112 away from frame 0 = 7.
    assert checks.frozen.value == 0.8
    assert checks.flicker.value == pytest.approx(1.75)
    assert checks.motion.value == pytest.approx(7.0, abs=1e-4)
    assert checks.blank.value == 0.0
    assert verdicts(checks) == {"blank": True, "frozen": False, "flicker": True, "motion": True}


def test_per_frame_noise_flickers():
    # A checkerboard that inverts every frame: every pixel changes by 255 at every step.
    y, x = np.indices((16, 16))
    video = np.stack([np.where((x + y + t) % 2 == 0, 255, 0) for t in range(5)]).astype(np.uint8)
    video = np.repeat(video[..., None], 3, axis=3)
    checks = check_video(video, NO_STRUCTURE)
    # Flicker 255 > 50. Half the pixels black (0.5 < 0.98) and far from flat: no blank frame. Motion: frames 1 and 3
    # differ from frame 0 by 255 everywhere.
    assert (checks.flicker.value, checks.blank.value, checks.frozen.value) == (255.0, 0.0, 0.0)
    assert checks.motion.value == pytest.approx(255.0, abs=1e-3)
    assert verdicts(checks) == {"blank": True, "frozen": True, "flicker": False, "motion": True}


def test_uniform_random_noise_reads_about_85_levels_of_flicker():
    # Two independent uniform levels 0..255 differ by (256^2 - 1) / (3 x 256) = 85.33 on average.
    video = np.random.default_rng(0).integers(0, 256, (9, 32, 32, 3), dtype=np.uint8)
    checks = check_video(video, NO_STRUCTURE)
    assert checks.flicker.value == pytest.approx(85.33, abs=0.5)
    assert not checks.flicker.passed and not checks.passed


def test_an_object_that_stays_still_with_grain_has_no_motion():
    # The prompt moves the square; it stays at x=6, and the whole picture wobbles by one level every other frame.
    video = frames(5)
    for t in range(5):
        square_at(video, t, 6)
        video[t] += t % 2
    checks = check_video(video, NO_STRUCTURE)
    # Every step changes every value by 1: flicker 1 (not frozen: 1 > 0.255). Motion: frames 1 and 3 are 1 level of
    # luma from frame 0 everywhere: 1 < 4.
    assert checks.flicker.value == 1.0 and checks.frozen.value == 0.0
    assert checks.motion.value == pytest.approx(1.0, abs=1e-4)
    assert verdicts(checks) == {"blank": True, "frozen": True, "flicker": True, "motion": False}
    assert checks.reason() == "motion 1 < 4"


def test_a_moving_square_passes_every_check():
    video = frames(5)
    for t in range(5):
        square_at(video, t, 2 * t)
    checks = check_video(video, NO_STRUCTURE)
    # Each step: 16 pixels x 3 x 112 / 768 = 7. Frame 4 (square at x=8) shares no pixel with frame 0's (x=0):
    # 32 of 256 luma pixels 112 away = 14.
    assert checks.flicker.value == pytest.approx(7.0)
    assert checks.motion.value == pytest.approx(14.0, abs=1e-4)
    assert checks.passed and checks.failed() == [] and checks.seam is None


def test_a_seam_score_is_checked_against_its_limit():
    video = frames(5)
    for t in range(5):
        square_at(video, t, 2 * t)
    assert check_video(video, NO_STRUCTURE, seam_score=1.5).seam.passed
    checks = check_video(video, Thresholds(max_seam=1.2, min_structure=0.0), seam_score=1.5)
    assert checks.reason() == "seam 1.5 > 1.2"
    assert checks.as_dict()["seam"] == {"value": 1.5, "limit": 1.2, "passed": False}


def test_a_seam_that_jumps_five_median_steps_is_flagged():
    # Flat frames at levels 0, 2, 4, 6, 16, 18, 20: steps 2, 2, 2, 10, 2, 2, median 2. A seam at frame 4 (the first
    # frame of the second chunk) is the step 6 -> 16: 10 / 2 = 5.
    video = np.stack([np.full((8, 8, 3), level, np.uint8) for level in (0, 2, 4, 6, 16, 18, 20)])
    assert seam_jump(video, [4]) == 5.0
    assert seam_jump(video, [2]) == 1.0  # a seam inside the even steps: 2 / 2
    assert seam_jump(video, [2, 4]) == 5.0  # the largest seam's
    assert seam_jump(video, []) is None
    flat = Thresholds(min_structure=0.0, max_blank=1.0)  # flat frames read as blank
    checks = check_video(video, flat, seam_jump=5.0)
    assert checks.reason() == "seam_jump 5 > 3"
    assert check_video(video, flat, seam_jump=1.0).passed
    # A still video whose one seam moves: no median step to compare with, flagged.
    still = np.stack([np.full((8, 8, 3), level, np.uint8) for level in (9, 9, 9, 30, 30)])
    assert seam_jump(still, [3]) == float("inf")


def test_thresholds_must_be_finite_and_not_negative():
    with pytest.raises(ValueError, match="min_motion must be a finite number of at least 0, got -1"):
        Thresholds(min_motion=-1)
    with pytest.raises(ValueError, match="max_flicker must be a finite number of at least 0, got nan"):
        Thresholds(max_flicker=float("nan"))
    with pytest.raises(ValueError, match="frames must be uint8"):
        check_video(np.zeros((3, 16, 16, 3), dtype=np.float32))


def test_noise_has_no_structure_and_a_drifting_ramp_has_it():
    # Independent uniform noise: no pixel correlates with its neighbour 8 px away or with the next frame.
    noise = np.random.default_rng(0).integers(0, 256, (9, 64, 64, 3), dtype=np.uint8)
    assert structure(noise.astype(np.float32) @ np.float32([0.2126, 0.7152, 0.0722])) < 0.01
    assert check_video(noise).reason().endswith("< 0.4")
    # A ramp across (2 levels a column) drifting 1 px a frame: each row is the next one, so down the picture every
    # shifted pixel matches (correlation 1), across it a ramp matches a shifted ramp but for its offset, and
    # consecutive frames' block means differ by one column's slope: both near 1.
    x = np.arange(64)
    video = np.stack([np.broadcast_to(((x + t) * 2 % 256)[None, :, None], (64, 64, 3)) for t in range(9)])
    checks = check_video(video.astype(np.uint8))
    assert checks.structure.value > 0.9 and checks.structure.passed


def test_a_flat_or_one_frame_video_is_left_to_blank_and_frozen():
    assert structure(np.full((3, 16, 16), 128.0)) == 1.0
    assert structure(np.full((1, 16, 16), 7.0)) == 1.0


def test_noise_kept_is_checked_and_nan_reads_as_kept():
    video = np.random.default_rng(1).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    assert check_video(video, noise_kept=0.2).denoised.passed
    assert check_video(video, noise_kept=1.0).denoised.reason() == "denoised 1 > 0.98"
    assert check_video(video, noise_kept=float("nan")).denoised.value == 1.0
    assert check_video(video).denoised is None  # diffusers' own loop: not measured
