"""Reference-free measures of a set of videos, as a distilled registration's gate compares them with its teacher's
on the same prompts and seeds (engine.levers.gate_rules.judge_distilled): flicker, motion, blank frames and frozen
videos.

Each takes raw uint8 (F, H, W, 3) frames and is plain numpy, so a check after every render can share them. Each is
compared with the teacher's figure on the same sample, never with a fixed level: a still prompt ("a bowl of fruit on
a table") moves little under any model, a fast one a lot.
"""

from __future__ import annotations

import numpy as np

# A frame is blank when its pixels' standard deviation (uint8 levels, every channel) is below this: a flat field.
# The toy world's frames, an object on a plain background, have 40 or more; Wan frames far more.
BLANK_STD = 2.0
# A video is frozen when FROZEN_RUN consecutive frames (FROZEN_RUN - 1 steps) each change by less than FROZEN_LEVEL
# uint8 levels on average over every pixel and channel: below what an 8-bit encode's rounding moves (an H.264 round
# trip of a still frame changes about 0.5-1 level), so only frames repeated bit for bit, or nearly, count. Four
# frames: half a second at Wan's 16 fps and at the toy world's 8.
FROZEN_RUN = 4
FROZEN_LEVEL = 0.25


def _steps(video: np.ndarray) -> np.ndarray:
    """The mean absolute change of each step between consecutive frames (F - 1 values)."""
    return np.abs(np.diff(video.astype(np.float32), axis=0)).mean(axis=(1, 2, 3))


def flicker(videos: list[np.ndarray]) -> float:
    """The mean absolute change between consecutive frames (uint8 levels, every pixel and channel), averaged over
    the videos: what a viewer sees as shimmer on top of the motion, which the teacher's renders of the same prompts
    and seeds share."""
    return float(np.mean([_steps(v).mean() for v in videos]))


def motion(videos: list[np.ndarray]) -> float:
    """How far the picture moves over each clip: the mean absolute difference between its first and last frames
    (uint8 levels, every pixel and channel), averaged over the videos. Shimmer that goes back and forth adds to
    flicker but little to this; an object that crosses the frame adds a lot; a video that freezes adds nothing."""
    return float(np.mean([np.abs(v[-1].astype(np.float32) - v[0].astype(np.float32)).mean() for v in videos]))


def blank_frames(videos: list[np.ndarray]) -> int:
    """How many frames of the videos are flat fields (pixel standard deviation below BLANK_STD)."""
    return int(sum((v.reshape(len(v), -1).std(axis=1) < BLANK_STD).sum() for v in videos))


def is_frozen(video: np.ndarray) -> bool:
    """Whether some FROZEN_RUN consecutive frames of `video` hardly change (each step under FROZEN_LEVEL)."""
    still = _steps(video) < FROZEN_LEVEL
    run = 0
    for s in still:
        run = run + 1 if s else 0
        if run >= FROZEN_RUN - 1:
            return True
    return False


def frozen_videos(videos: list[np.ndarray]) -> int:
    """How many of the videos hold a frozen stretch (is_frozen)."""
    return sum(is_frozen(v) for v in videos)
