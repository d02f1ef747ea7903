"""A long video's chunks joined (engine.long.chunks plans them): their latents stitched with a crossfade over each
overlap, and the seam score of the decoded frames."""

from __future__ import annotations

import numpy as np
import torch

from engine.long.chunks import ChunkPlan


def stitch(chunks: list[torch.Tensor], chunk_plan: ChunkPlan) -> torch.Tensor:
    """One latent video (C, F, h, w) from the chunks' latents (each C, window_latents, h, w): chunk 0 whole, then
    each later chunk crossfaded over the overlap (weights linear from the earlier chunk to the later) and appended;
    cut to the video's latent length."""
    if len(chunks) != chunk_plan.chunks:
        raise ValueError(f"{len(chunks)} chunks given, the plan has {chunk_plan.chunks}")
    video = chunks[0]
    o = chunk_plan.overlap
    for chunk in chunks[1:]:
        ramp = torch.linspace(0, 1, o + 2, dtype=chunk.dtype, device=chunk.device)[1:-1].view(1, o, 1, 1)
        blended = video[:, -o:] * (1 - ramp) + chunk[:, :o] * ramp
        video = torch.cat([video[:, :-o], blended, chunk[:, o:]], dim=1)
    return video[:, : chunk_plan.latents]


def seam_score(frames: np.ndarray, seams: list[int]) -> float | None:
    """Mean absolute frame-to-frame difference across the seams over the mean within chunks: about 1 when a seam
    looks like any other step of the motion, higher when the picture jumps. None without seams."""
    if not seams:
        return None
    steps = np.abs(np.diff(frames.astype(np.float32), axis=0)).mean(axis=(1, 2, 3))  # steps[i]: frame i -> i + 1
    at_seam = np.zeros(len(steps), dtype=bool)
    at_seam[[s - 1 for s in seams]] = True
    inside = steps[~at_seam].mean()
    return float(steps[at_seam].mean() / inside) if inside > 0 else float("inf")
