"""Full-reference video metrics: how close one render is to another of the same video.

Both take uint8 (F, H, W, 3) frames. PSNR is per frame and per video over every pixel; SSIM follows Wang et al.
(2004) with a 7x7 uniform window (scikit-image's default), on each RGB channel, averaged.
"""

from __future__ import annotations

import numpy as np
import torch

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


def ssim(a: np.ndarray, b: np.ndarray, window: int = 7) -> float:
    """Mean SSIM over every frame, channel and window position (1.0 for identical videos)."""
    _check_pair(a, b)
    if min(a.shape[1:3]) < window:
        raise ValueError(f"frames must be at least {window}x{window} for SSIM, got {a.shape[2]}x{a.shape[1]}")
    # (F, H, W, 3) -> (F*3, 1, H, W) in [0, 255]
    x, y = (torch.from_numpy(v).permute(0, 3, 1, 2).reshape(-1, 1, *v.shape[1:3]).double() for v in (a, b))
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def mean(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(t, window, stride=1)

    mx, my = mean(x), mean(y)
    # Sample (not population) covariances over the window, as scikit-image uses.
    n = window * window
    vx = (mean(x * x) - mx * mx) * n / (n - 1)
    vy = (mean(y * y) - my * my) * n / (n - 1)
    cxy = (mean(x * y) - mx * my) * n / (n - 1)
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s.mean())
