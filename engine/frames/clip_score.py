"""Prompt adherence where no toy judge reads the prompts: a CLIP score, from a CLIP folder the operator registers
(`clip:` in the models file), loaded from its local files with transformers' CLIPModel and CLIPProcessor.

CLIP score (Hessel et al. 2021, CLIPScore without its 2.5 weight; "CLIPSIM" in text-to-video papers x 100): for
each sampled frame, max(100 x cos(image embedding, text embedding), 0); a video's score is the mean over FRAMES
frames spread evenly from first to last, and a set's the mean over its videos. It is compared only between a
student and its teacher on the same prompts and seeds (engine.levers.gate_rules.CLIP_MARGIN), never against a fixed
level: scores move with the CLIP model, the resolution and the prompts' style.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# Frames scored per video, evenly spaced from the first to the last (CLIPSIM papers score every frame; four cover a
# clip's start, end and middle at a twentieth of the cost of Wan's 81).
FRAMES = 4


class ClipScorer:
    def __init__(self, folder: Path):
        from transformers import CLIPModel, CLIPProcessor

        self.model = CLIPModel.from_pretrained(folder, local_files_only=True).eval()
        self.processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)

    @torch.no_grad()
    def video(self, prompt: str, frames: np.ndarray) -> float:
        """The CLIP score of one video (uint8 (F, H, W, 3)) against its prompt."""
        picks = np.unique(np.linspace(0, len(frames) - 1, FRAMES).round().astype(int))
        inputs = self.processor(text=[prompt], images=[frames[i] for i in picks], return_tensors="pt",
                                padding=True, truncation=True)
        out = self.model(**inputs)
        # image_embeds and text_embeds are the projected embeddings, each scaled to unit length: their dot product
        # is the cosine.
        cos = (out.image_embeds @ out.text_embeds.T)[:, 0]
        return float((100 * cos).clamp(min=0).mean())

    def mean(self, prompts: list[str], videos: list[np.ndarray]) -> float:
        """The set's CLIP score: the mean of its videos'."""
        return float(np.mean([self.video(p, v) for p, v in zip(prompts, videos)]))
