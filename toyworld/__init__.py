"""The toy world: procedurally generated clips with prompts from a small grammar, and a judge that reads them back.

It gives a small model something learnable to train on and a pixel-level measure of prompt adherence.
"""

from toyworld.judge import Scores, Verdict, judge_clip, object_steps, score, seam_steps
from toyworld.world import ClipSpec, dataset, parse_prompt, render_clip, sample_spec

__all__ = [
    "ClipSpec",
    "Scores",
    "Verdict",
    "dataset",
    "judge_clip",
    "object_steps",
    "parse_prompt",
    "render_clip",
    "sample_spec",
    "score",
    "seam_steps",
]
