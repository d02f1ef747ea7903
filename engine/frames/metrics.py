"""Full-reference video metrics: how close one render is to another of the same video.

Both take uint8 (F, H, W, 3) frames. PSNR is per frame and per video over every pixel; SSIM follows Wang et al.
(2004) in numpy: 8-bit constants C1 = (0.01*255)^2 and C2 = (0.03*255)^2, a uniform 7x7 window (scikit-image's
default, not the paper's 11x11 Gaussian of sigma 1.5) at every position inside the frame, sample (n-1) variances as
scikit-image computes them, on each RGB channel; the per-window values averaged.
"""

from __future__ import annotations

import numpy as np

# Identical frames have infinite PSNR; report this instead so results stay finite, sortable and JSON-safe.
PSNR_CAP_DB = 100.0


def _check_pair(a: np.ndarray, b: np.ndarray) -> None:
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"{name} must be uint8 (F, H, W, 3), got {getattr(x, 'shape', type(x))}")
    if a.shape != b.shape:
        raise ValueError(f"videos differ in shape: {a.shape} vs {b.shape}")


def psnr_frames(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PSNR in dB of each frame of `a` against the same frame of `b`, capped at PSNR_CAP_DB."""
    _check_pair(a, b)
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(1, 2, 3))
    with np.errstate(divide="ignore"):
        db = 10 * np.log10(255.0**2 / mse)
    return np.minimum(db, PSNR_CAP_DB)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB over the whole video (one mean squared error over every pixel), capped at PSNR_CAP_DB."""
    _check_pair(a, b)
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return PSNR_CAP_DB if mse == 0 else min(PSNR_CAP_DB, 10 * np.log10(255.0**2 / mse))


def _window_mean(x: np.ndarray, window: int) -> np.ndarray:
    """The mean of every `window` x `window` square inside each (.., H, W) plane: a summed-area table, so each
    position costs four lookups whatever the window."""
    table = np.pad(x.cumsum(axis=-2).cumsum(axis=-1), [(0, 0)] * (x.ndim - 2) + [(1, 0), (1, 0)])
    w = window
    total = table[..., w:, w:] - table[..., :-w, w:] - table[..., w:, :-w] + table[..., :-w, :-w]
    return total / (w * w)


def ssim_frames(a: np.ndarray, b: np.ndarray, window: int = 7) -> np.ndarray:
    """SSIM of each frame of `a` against the same frame of `b` (mean over its channels and window positions)."""
    _check_pair(a, b)
    if min(a.shape[1:3]) < window:
        raise ValueError(f"frames must be at least {window}x{window} for SSIM, got {a.shape[2]}x{a.shape[1]}")
    # (F, H, W, 3) -> (F, 3, H, W) in [0, 255]
    x, y = (np.moveaxis(v, -1, 1).astype(np.float64) for v in (a, b))
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = _window_mean(x, window), _window_mean(y, window)
    n = window * window
    vx = (_window_mean(x * x, window) - mx * mx) * n / (n - 1)
    vy = (_window_mean(y * y, window) - my * my) * n / (n - 1)
    cxy = (_window_mean(x * y, window) - mx * my) * n / (n - 1)
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return s.mean(axis=(1, 2, 3))


def ssim(a: np.ndarray, b: np.ndarray, window: int = 7) -> float:
    """Mean SSIM over every frame, channel and window position (1.0 for identical videos)."""
    return float(ssim_frames(a, b, window).mean())
