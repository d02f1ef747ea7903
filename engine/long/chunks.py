"""Long videos as a chain of same-shape chunks: the plan and each chunk's seed (engine.long.stitch joins them).

A model renders at most a window of frames (ModelInfo.max_frames: what it was trained on). A longer video is planned
in latent frames (Wan's causal VAE: latent 0 is one frame, every later latent `temporal_factor` frames): N chunks of
the window's latent length, each overlapping the one before by `overlap` latents. Chunk k+1 is generated with its
first `overlap` latents tied to chunk k's last ones (at each step, re-noised to its level or held clean, as the
model's `chunk_condition` says: engine.loop.conditioning), and the stitched latent video keeps chunk 0 whole and, from
each later chunk, a crossfade over the overlap and the rest.
Every chunk has the window's shape, so chunks batch with short videos of that shape; cost grows linearly with the
number of chunks and memory stays at one window. The last chunk renders a whole window too (same shape) and the
stitched latents are cut to the video's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.types import stable_seed


@dataclass(frozen=True)
class ChunkPlan:
    frames: int  # the video's frames (temporal_factor * k + 1)
    window: int  # frames per chunk, the model's window
    overlap: int  # latent frames shared by consecutive chunks
    temporal_factor: int

    @property
    def latents(self) -> int:
        """The video's latent frames."""
        return (self.frames - 1) // self.temporal_factor + 1

    @property
    def window_latents(self) -> int:
        return (self.window - 1) // self.temporal_factor + 1

    @property
    def chunks(self) -> int:
        if self.latents <= self.window_latents:
            return 1
        return 1 + math.ceil((self.latents - self.window_latents) / (self.window_latents - self.overlap))

    def start(self, chunk: int) -> int:
        """The latent index of the video where `chunk` begins."""
        return chunk * (self.window_latents - self.overlap)

    def seams(self) -> list[int]:
        """Output frame indices where a chunk's own content begins (after its overlap), for each chunk after the
        first that reaches into the video."""
        out = []
        for k in range(1, self.chunks):
            latent = self.start(k) + self.overlap  # the first latent this chunk adds
            if latent < self.latents:
                out.append(1 + (latent - 1) * self.temporal_factor)
        return out


def chunk_seed(seed: int, chunk: int) -> int:
    """The seed of a long video's chunk `chunk`: the video's own for chunk 0 (a one-window video renders as it
    always did), a seed derived from (seed, chunk) after it. Every chunk drawing the video's seed would start from
    the same noise, and on the toy model that noise pulled each chunk's object back towards where chunk 0 had put
    it: on 16 videos of 5 chunks, 14 windows lost their direction against 4 with a seed per chunk
    (docs/LONG_VIDEOS.md)."""
    return seed if chunk == 0 else stable_seed(seed, chunk)


def plan(frames: int, window: int, overlap: int, temporal_factor: int) -> ChunkPlan:
    """Chunks for a video of `frames`; a video within the window is one chunk. ValueError names what is wrong."""
    for name, value in (("frames", frames), ("window", window)):
        if value < 1 or (value - 1) % temporal_factor:
            raise ValueError(f"{name} {value} is not {temporal_factor}k+1")
    result = ChunkPlan(frames, window, overlap, temporal_factor)
    if result.latents > result.window_latents and not 0 < overlap < result.window_latents:
        raise ValueError(f"overlap {overlap} latents must be between 1 and {result.window_latents - 1}")
    return result
