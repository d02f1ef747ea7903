"""Cheap reference-free checks on a rendered video's uint8 frames: blank frames, a frozen stretch, flicker, too little
motion and, for a long video stitched from chunks, its seams. Each measures one value and compares it with a limit;
none needs another render to compare against, so every video of every model can be checked after its render.

What each measures, and where it comes from:
- blank: the fraction of frames that are blank. A frame is blank when at least 98% of its pixels are black (BT.709
  luma at or under 10% of full scale), ffmpeg blackdetect's `picture_black_ratio_th` 0.98 and `pixel_black_th` 0.10,
  or when it is flat (its pixels' standard deviation, every channel, under 2 levels of 255: one colour, whatever it
  is; engine.levers.gate_measures.BLANK_STD, the distilled gate's blank frame).
- frozen: the longest stretch of frames with no change, as a fraction of the video's frames. A step between two
  frames is "no change" when their mean absolute difference is at most 0.001 of full scale, ffmpeg freezedetect's
  default noise tolerance (-60 dB).
- flicker: VBench's temporal_flickering measure: the mean absolute difference between consecutive frames, in levels
  of 255 (VBench reports it as (255 - this) / 255). Per-frame noise reads about 85, a moving object a few levels.
- motion: how far the picture gets from its first frame: the largest mean absolute difference, over the video, of a
  frame's coarse luma (averaged over blocks of about 1/16 of the shorter side) from the first frame's. Averaging over
  blocks keeps pixel grain out of it (a still object with per-frame noise reads near 0, where a plain frame
  difference would read the noise as motion), and it costs two numpy reductions a frame. Block matching would give
  the displacement in pixels but costs a search window's worth of differences per block, and flat regions make its
  answer ambiguous; a check that only has to tell "moves" from "does not" does not need it.
- seam: engine.long.stitch.seam_score of a stitched long video (None for a video of one window).
- seam_jump: a long video's largest step (mean absolute difference) across a seam over the median step of the whole
  video: a seam that jumps several times as far as the video usually moves, which the seam score (a mean over
  seams, against the mean step) can average away.
- structure: whether the frames read as decoded noise (a model that did nothing, or whose blocks are zero or random,
  still passes the checks above: its VAE makes noise smooth). Spatial coherence S, the correlation of each frame's
  luma (less its mean) with itself shifted by 1/8 of the shorter side, across and down, times temporal coherence T,
  the mean correlation of consecutive frames' block-averaged luma (blocks of 1/8 of the side, less their mean). A
  VAE's reach is its factor (4-16 px), so decoded noise is uncorrelated at 1/8 of a side and from one latent frame to
  the next; a picture is not. Two numpy reductions a frame.
- denoised: engine.loop.denoise.kept of the video (how much of its initial noise its final latents kept: 1 when the
  denoiser moved nothing, NaN when they are not finite); None where diffusers' own loop rendered it.

The limits' defaults were chosen from 80 renders each of `toy` and `toy-fast` and from videos made bad on purpose
(docs/QUALITY.md, "Checks on every video"); a registration may set its own (`checks:` in the models file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

# ffmpeg blackdetect's defaults: a pixel is black at or under 10% of full scale; a frame is black when 98% of its
# pixels are.
BLACK_PIXEL = 0.10 * 255
BLACK_RATIO = 0.98
# A frame whose pixels vary by less than this (standard deviation over every channel, levels of 255) is one flat
# colour: blank too. engine.levers.gate_measures.BLANK_STD, so this check and the distilled gate call the same frames
# blank.
FLAT_STD = 2.0
# ffmpeg freezedetect's default noise tolerance, -60 dB: 0.001 of full scale, as a mean absolute difference.
FROZEN_NOISE = 0.001 * 255
# BT.709 luma weights (as blackdetect reads the Y plane of BT.709 video).
LUMA = np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)


@dataclass(frozen=True)
class Thresholds:
    """The limits a video's checks are held to. Defaults from measurements (docs/QUALITY.md); a registration may
    set any of them (`checks:` in the models file, engine.models.file)."""

    # Fail when more than this fraction of the frames is blank (normal renders: 0; all black: 1).
    max_blank: float = 0.5
    # Fail when the longest frozen stretch is more than this fraction of the frames (normal renders: 0; frozen after
    # the second of 9 frames: 0.889).
    max_frozen: float = 0.5
    # Fail when consecutive frames differ by more than this, in levels of 255 (VBench temporal_flickering's MAD).
    # Normal renders read 4.8-36 (toy and toy-fast, 80 each), per-frame noise 84-86: 50 sits between with room on
    # both sides (30 flagged one normal video of each model).
    max_flicker: float = 50.0
    # Fail when the coarse picture never gets further than this from its first frame, in levels of 255. Normal
    # renders read 12.9 and more, a still object under grain of +-4 levels at most 1.25, without grain 0.
    min_motion: float = 4.0
    # Fail when a long video's seam score is over this (engine.long.stitch.seam_score; REELBATCH_SEAM_REVIEW's default).
    max_seam: float = 2.0
    # Fail when the frames' structure (S x T) is under this. Normal toy, toy-fast, toy-i2v renders read 0.432 and
    # more (48 each), decoded noise (proj_out zeroed) 0.29 at most, zeroed or random blocks 0.14-0.47
    # (docs/QUALITY.md). 0 turns it off: a random-weight model (`tiny`) draws noise by design.
    min_structure: float = 0.40
    # Fail when a long video's largest seam step is more than this many times its median step.
    max_seam_jump: float = 3.0
    # Fail when the final latents kept more of the initial noise than this (cosine). Normal renders: toy family
    # 0.05-0.22, random-weight Wan models 0.83-0.88; a transformer that outputs nothing: 1.
    max_noise_kept: float = 0.98

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{f.name} must be a finite number of at least 0, got {value!r}")


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Check:
    """One check's measured value against its limit: `at_most` limits fail above, the others (motion) below."""

    name: str
    value: float
    limit: float
    at_most: bool = True

    @property
    def passed(self) -> bool:
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def reason(self) -> str:
        return f"{self.name} {self.value:.3g} {'>' if self.at_most else '<'} {self.limit:g}"


@dataclass(frozen=True)
class VideoChecks:
    blank: Check
    frozen: Check
    flicker: Check
    motion: Check
    seam: Check | None = None  # a long video's only
    seam_jump: Check | None = None  # a long video's only
    structure: Check | None = None  # None where min_structure is 0
    denoised: Check | None = None  # None where the loop was not ours (noise_kept not measured)

    def all(self) -> list[Check]:
        return [c for c in (self.blank, self.frozen, self.flicker, self.motion, self.seam, self.seam_jump,
                            self.structure, self.denoised) if c is not None]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.all())

    def failed(self) -> list[Check]:
        return [c for c in self.all() if not c.passed]

    def reason(self) -> str:
        """What failed, for an error or a report line: "frozen 0.889 > 0.5; motion 0 < 4"."""
        return "; ".join(c.reason() for c in self.failed())

    def as_dict(self) -> dict:
        """Plain values for JSON: {name: {value, limit, passed}}, in check order."""
        return {c.name: {"value": round(c.value, 6), "limit": c.limit, "passed": c.passed} for c in self.all()}


def check_video(frames: np.ndarray, thresholds: Thresholds = DEFAULT_THRESHOLDS,
                seam_score: float | None = None, noise_kept: float | None = None,
                seam_jump: float | None = None) -> VideoChecks:
    """Every check of uint8 (F, H, W, 3) frames against `thresholds`; `seam_score`: a stitched long video's;
    `seam_jump`: a stitched long video's (seam_jump below); `noise_kept`: engine.loop.denoise.kept's (NaN reads as 1:
    latents that are not finite were not denoised)."""
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 (F, H, W, 3), got {getattr(frames, 'dtype', type(frames))} "
                         f"{getattr(frames, 'shape', '')}")
    x = frames.astype(np.float32)
    luma = x @ LUMA  # (F, H, W)
    steps = np.abs(np.diff(x, axis=0)).mean(axis=(1, 2, 3)) if len(frames) > 1 else np.zeros(0, np.float32)
    t = thresholds
    return VideoChecks(
        blank=Check("blank", blank_fraction(x, luma), t.max_blank),
        frozen=Check("frozen", frozen_fraction(steps, len(frames)), t.max_frozen),
        flicker=Check("flicker", float(steps.mean()) if len(steps) else 0.0, t.max_flicker),
        motion=Check("motion", motion(luma), t.min_motion, at_most=False),
        seam=None if seam_score is None else Check("seam", float(seam_score), t.max_seam),
        seam_jump=None if seam_jump is None else Check("seam_jump", float(seam_jump), t.max_seam_jump),
        structure=None if t.min_structure == 0 else Check("structure", structure(luma), t.min_structure,
                                                          at_most=False),
        denoised=None if noise_kept is None else Check(
            "denoised", 1.0 if not math.isfinite(noise_kept) else float(noise_kept), t.max_noise_kept),
    )


def blank_fraction(x: np.ndarray, luma: np.ndarray) -> float:
    """The fraction of frames (x: F, H, W, 3; luma: F, H, W) that are black (blackdetect) or flat."""
    black = (luma <= BLACK_PIXEL).mean(axis=(1, 2)) >= BLACK_RATIO
    flat = x.reshape(len(x), -1).std(axis=1) < FLAT_STD
    return float((black | flat).mean())


def frozen_fraction(steps: np.ndarray, frames: int) -> float:
    """The longest run of frames joined by still steps (each at most FROZEN_NOISE), over `frames`; 0 with none."""
    longest = run = 0
    for still in steps <= FROZEN_NOISE:
        run = run + 1 if still else 0
        longest = max(longest, run)
    return (longest + 1) / frames if longest else 0.0


def motion(luma: np.ndarray) -> float:
    """The largest mean absolute difference of a frame's block-averaged luma from the first frame's."""
    f, h, w = luma.shape
    block = max(1, min(h, w) // 16)
    hb, wb = h // block, w // block
    coarse = luma[:, :hb * block, :wb * block].reshape(f, hb, block, wb, block).mean(axis=(2, 4))
    return float(np.abs(coarse - coarse[:1]).mean(axis=(1, 2)).max())



def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of two arrays already less their means (0 where either is flat)."""
    d = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / d) if d > 0 else 0.0


def structure(luma: np.ndarray) -> float:
    """Spatial coherence (at a lag of 1/8 of the shorter side) times temporal coherence (consecutive frames'
    block-averaged luma), each floored at 0; a video of one frame, or flat, reads 1 (blank and frozen judge those)."""
    f, h, w = luma.shape
    lag = max(1, min(h, w) // 8)
    dev = luma - luma.mean(axis=(1, 2), keepdims=True)
    if f < 2 or not dev.any():
        return 1.0
    across, down = (dev[:, :, :-lag], dev[:, :, lag:]), (dev[:, :-lag], dev[:, lag:])
    num = (across[0] * across[1]).sum() + (down[0] * down[1]).sum()
    den = np.sqrt(((across[0] ** 2).sum() + (down[0] ** 2).sum()) * ((across[1] ** 2).sum() + (down[1] ** 2).sum()))
    spatial = float(num / den) if den > 0 else 0.0
    hb, wb = h // lag, w // lag
    coarse = luma[:, :hb * lag, :wb * lag].reshape(f, hb, lag, wb, lag).mean(axis=(2, 4))
    coarse = coarse - coarse.mean(axis=(1, 2), keepdims=True)
    temporal = float(np.mean([_corr(a, b) for a, b in zip(coarse[:-1], coarse[1:])]))
    return max(spatial, 0.0) * max(temporal, 0.0)


def seam_jump(frames: np.ndarray, seams: list[int]) -> float | None:
    """The largest step across a seam (seams: the first frame of each later chunk) over the video's median step; None
    without seams, inf where the median step is 0 and a seam moves."""
    if not seams:
        return None
    steps = np.abs(np.diff(frames.astype(np.float32), axis=0)).mean(axis=(1, 2, 3))  # steps[i]: frame i -> i + 1
    jump, median = float(steps[[s - 1 for s in seams]].max()), float(np.median(steps))
    return jump / median if median > 0 else (float("inf") if jump > 0 else 1.0)
