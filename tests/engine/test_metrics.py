"""PSNR and SSIM against values worked out by hand."""

import numpy as np
import pytest

from engine.metrics import PSNR_CAP_DB, psnr, psnr_frames, ssim


def video(value=0, shape=(3, 16, 16)):
    return np.full((*shape, 3), value, dtype=np.uint8)


def test_identical_videos_score_the_cap_and_ssim_one():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    assert psnr(a, a) == PSNR_CAP_DB
    assert np.all(psnr_frames(a, a) == PSNR_CAP_DB)
    assert ssim(a, a) == pytest.approx(1.0)


@pytest.mark.parametrize(("diff", "expected_db"), [(1, 48.1308), (16, 24.0484), (255, 0.0)])
def test_psnr_of_a_uniform_offset(diff, expected_db):
    # MSE = diff^2, so PSNR = 20 log10(255 / diff).
    assert psnr(video(0), video(diff)) == pytest.approx(expected_db, abs=1e-3)


def test_psnr_frames_finds_the_one_bad_frame():
    a, b = video(100), video(100)
    b[1] = 110
    db = psnr_frames(a, b)
    assert db[0] == db[2] == PSNR_CAP_DB and db[1] == pytest.approx(20 * np.log10(25.5), abs=1e-6)
    # The whole-video figure averages the error over all frames first: 3x the MSE of one frame's share.
    assert psnr(a, b) == pytest.approx(10 * np.log10(255**2 / (100 / 3)), abs=1e-6)


def test_ssim_falls_as_noise_grows_and_ignores_nothing():
    rng = np.random.default_rng(1)
    ramp = np.linspace(40, 210, 32)
    a = np.broadcast_to((ramp[:, None] + ramp[None, :])[None, :, :, None] / 2, (2, 32, 32, 3)).astype(np.uint8)

    def noisy(amplitude):
        return np.clip(a.astype(int) + rng.integers(-amplitude, amplitude + 1, a.shape), 0, 255).astype(np.uint8)

    scores = [ssim(a, noisy(amplitude)) for amplitude in (2, 10, 40)]
    assert 1.0 > scores[0] > scores[1] > scores[2] > 0.0
    assert scores[0] > 0.8 and scores[2] < 0.5
    assert ssim(a, a[:, ::-1].copy()) < 0.5, "the same pixels in another arrangement are not the same video"


def test_mismatched_or_wrong_inputs_are_refused():
    with pytest.raises(ValueError, match="differ in shape"):
        psnr(video(0), video(0, (2, 16, 16)))
    with pytest.raises(ValueError, match="uint8"):
        psnr(video(0).astype(np.float32), video(0))
    with pytest.raises(ValueError, match="at least 7x7"):
        ssim(video(0, (1, 4, 4)), video(0, (1, 4, 4)))
