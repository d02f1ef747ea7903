"""PSNR and SSIM against values worked out by hand."""

import numpy as np
import pytest

from engine.frames.metrics import PSNR_CAP_DB, psnr, psnr_frames, ssim


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


def test_ssim_of_one_window_worked_by_hand():
    # 7x7 frames hold one window position. a = 100 and b = 110 everywhere: no variance, no covariance, so SSIM is
    # (2*100*110 + C1) / (100^2 + 110^2 + C1) with C1 = (0.01*255)^2 = 6.5025: 22006.5025 / 22106.5025.
    assert ssim(video(100, (1, 7, 7)), video(110, (1, 7, 7))) == pytest.approx(0.9954764, abs=1e-6)
    # One pixel of 255 in a black window against black: mean 255/49 = 5.2041, sample variance 65025/49 = 1327.04,
    # so (C1 / (27.0825 + C1)) * (C2 / (1327.0408 + C2)), C2 = (0.03*255)^2 = 58.5225: 0.193613 * 0.042237.
    a = video(0, (1, 7, 7))
    a[0, 3, 3] = 255
    assert ssim(a, video(0, (1, 7, 7))) == pytest.approx(0.0081777, abs=1e-6)


def test_ssim_averages_every_window_position():
    # 7 high, 8 wide: two positions. b is 110 in columns 0-6 and 100 in column 7; a is 100 everywhere. The first
    # window is the case above (0.9954764). The second holds 42 values of 110 and 7 of 100: mean 108.5714, sample
    # variance (6/49 * 100) * 49/48 = 600/48 = 12.5, so (21714.286 + C1) / (21787.755 + C1) * C2 / (12.5 + C2)
    # = 0.996629 * 0.823999 = 0.821223. Their mean: 0.908350.
    b = video(110, (1, 7, 8))
    b[0, :, 7] = 100
    assert ssim(video(100, (1, 7, 8)), b) == pytest.approx(0.908350, abs=1e-5)
