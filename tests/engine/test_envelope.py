"""The memory envelope's arithmetic (engine.models.envelope), every expected value worked out by hand."""

import pytest

from engine.models.envelope import Envelope, Point, fit, tokens
from engine.models.shape_rules import TINY_RULES, ShapeRules

MiB, GiB = 2**20, 2**30
TOY_RULES = ShapeRules(vae_spatial=4, vae_temporal=2, patch=(1, 2, 2), rope_max_seq_len=64)


def test_tokens_are_latent_frames_times_patches():
    # tiny: (9 - 1) // 4 + 1 = 3 latent frames, each (64 / 16) x (64 / 16) = 16 patches.
    assert tokens(TINY_RULES, 64, 64, 9) == 48
    # toy: (9 - 1) // 2 + 1 = 5 latent frames of (32 / 8) x (32 / 8) = 16; 832x480, 81 frames on tiny: 21 x 52 x 30.
    assert tokens(TOY_RULES, 32, 32, 9) == 80
    assert tokens(TINY_RULES, 832, 480, 81) == 32760


def line(w, h, f, b, tok, peak):
    return Point(w, h, f, b, tok, peak)


def test_points_on_a_line_give_the_line_back():
    # fixed 10 MiB, 1000 B a latent token, 100 B a frame pixel:
    # 1 x 64x64x9 (48 tokens): 10485760 + 48000 + 409600; 2 x 64x64x9: + 96000 + 819200; 1 x 64x64x17 (80): + 80000
    points = [line(64, 64, 9, 1, 48, 10943360), line(64, 64, 9, 2, 48, 11400960), line(64, 64, 17, 1, 80, 10975360),
              line(128, 64, 9, 1, 96, 11400960)]
    fixed, per_token, per_pixel = fit(points)
    assert fixed == pytest.approx(10485760, rel=1e-6)
    assert per_token == pytest.approx(1000, rel=1e-4)
    assert per_pixel == pytest.approx(100, rel=1e-4)


def test_a_part_that_would_be_negative_is_left_out_and_the_line_lifted_to_every_point():
    # More pixels but less memory (a CPU's batch of 2 can take less than 1): the pixel part comes out negative and is
    # left out; then the token part (slope of 20, 15, 20 MiB over 48, 96, 80 tokens: negative) too; the fixed part,
    # the mean 18.33 MiB, is then lifted to the highest point, 20 MiB.
    points = [line(64, 64, 9, 1, 48, 20 * MiB), line(64, 64, 9, 2, 48, 15 * MiB), line(64, 64, 17, 1, 80, 20 * MiB)]
    assert fit(points) == (20 * MiB, 0.0, 0.0)


def test_the_fitted_line_is_never_below_a_point_it_was_fitted_on():
    points = [line(64, 64, 9, 1, 48, 10943360 + MiB), line(64, 64, 9, 2, 48, 11400960),
              line(64, 64, 17, 1, 80, 10975360), line(128, 64, 9, 1, 96, 11400960)]
    fixed, per_token, per_pixel = fit(points)
    gaps = [fixed + per_token * p.batch * p.tokens + per_pixel * p.batch * p.width * p.height - p.peak_bytes
            for p in points]
    assert min(gaps) == pytest.approx(0, abs=1.0)
    assert all(g > -1.0 for g in gaps)


# 10 GiB of memory, 1 GiB resident, 20% spare: 8 GiB - 1 GiB = 7 GiB for a batch; a fixed 1 GiB leaves 6144 MiB.
ENVELOPE = Envelope("m", "cuda: X, 10.0 GiB", memory_bytes=10 * GiB, resident_bytes=GiB, fixed_bytes=GiB,
                    per_token_bytes=MiB, per_pixel_bytes=0.0)


def test_the_largest_batch_leaves_a_fifth_of_memory_free():
    assert ENVELOPE.budget_bytes == 7 * GiB
    assert ENVELOPE.largest_batch(100, 64, 64) == 61  # 6144 MiB / 100 MiB a video = 61.44
    assert ENVELOPE.largest_batch(6144, 64, 64) == 1  # exactly the room
    assert ENVELOPE.largest_batch(6145, 64, 64) == 0  # not one video fits
    assert ENVELOPE.largest_batch(1, 64, 64) == 64  # 6144 would fit; no batch above 64 is planned
    assert ENVELOPE.predict(2, 100, 64, 64) == GiB + 200 * MiB


def test_an_out_of_memory_error_shrinks_the_envelope_below_the_batch_that_failed():
    smaller = ENVELOPE.shrunk(61, 100, 64, 64, "m|64x64|f9|s4|g5")
    assert smaller.largest_batch(100, 64, 64) == 60
    assert (smaller.ooms, smaller.last_oom) == (1, "61 x m|64x64|f9|s4|g5")
    # A batch the line already refused (62 x 100 MiB > 6144 MiB) leaves the line as it was, and is counted.
    same = ENVELOPE.shrunk(62, 100, 64, 64, "k")
    assert (same.per_token_bytes, same.ooms) == (MiB, 1)
