"""The toy world's samples. The fixed quality set (`reelbatch quality`, the exact-mode references a model ships): the
same 80 prompt/seed pairs every time, so renders can be compared byte for byte. And the held-out draws a gate and a
model card judge on: seeds drawn afresh from a range that training, distillation, the quality set and the
validation sets never draw from, so no figure they give was tuned on them. Plain values, so commands can name them
without loading torch."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from toyworld.world import BACKGROUNDS, COLOURS, DIRECTIONS, SHAPES

SAMPLE_SIZE = 80
SEED_BASE = 7000
# Held-out seeds: [2^32, 2^40). Training draws from [10^6, 2^31) (toyworld.world.dataset via the train and distill
# configs), the quality set is 7000-7079, the long-video and validation sets 9000-9239, the judge's hand-labelled clips
# 3,000,000,000-3,000,000,079 (tests/fixtures/judge_labels.json), the search for long videos' seam jumps
# 3,200,000,000-3,200,002,047 (docs/LONG_VIDEOS.md): none reaches 2^32.
# The unseen pictures' two sets (jobs.quality.images.UNSEEN_SEEDS) start at 2^40, above every draw.
HELD_OUT_SEEDS = (2**32, 2**40)
# A toy-world gate's sample by default. A distilled gate allows each attribute 2 points under the teacher's, on the
# same prompts and seeds, so the sampling noise of the paired difference must be well under 2 points: its standard
# error is sqrt(d / n) for a share d of discordant pairs (one right, the other wrong). On 160 held-out pairs toy and
# toy-fast disagreed on shape in 17 (d = 0.106, docs/QUALITY.md): at n = 1200 the standard error is 0.94 points, so 2
# points is 2.1 standard errors (at the old 80: 3.6 points, wider than the margin itself).
GATE_SAMPLE_SIZE = 1200


@dataclass(frozen=True)
class Case:
    prompt: str
    seed: int


def sample_set(count: int = SAMPLE_SIZE) -> list[Case]:
    """The first `count` cases of a fixed set. Case i takes colour i mod 5, shape i mod 2, direction (i // 2) mod 4
    and background (i // 8) mod 2: by the Chinese remainder theorem each of the 80 prompts appears once in any 80
    consecutive cases, and every 16 consecutive cases hold every attribute value."""
    return [Case(prompt_at(i), SEED_BASE + i) for i in range(count)]


def prompt_at(i: int) -> str:
    """Case i's prompt (sample_set's order)."""
    colours, directions, backgrounds = list(COLOURS), list(DIRECTIONS), list(BACKGROUNDS)
    return (f"a {colours[i % 5]} {SHAPES[i % 2]} moving {directions[(i // 2) % 4]} "
            f"on a {backgrounds[(i // 8) % 2]} background")


def new_entropy() -> int:
    """A fresh draw's entropy: unknown until the gate runs, so nothing can have been chosen by its seeds."""
    return secrets.randbits(64)


def held_out_set(count: int, entropy: int) -> list[Case]:
    """`count` cases with sample_set's prompts (every attribute value in any 16 in a row) and seeds drawn from
    HELD_OUT_SEEDS by numpy's default generator seeded with `entropy` (recorded with what it measured, so the draw
    can be rendered again)."""
    seeds = np.random.default_rng(entropy).integers(*HELD_OUT_SEEDS, count)
    return [Case(prompt_at(i), int(seed)) for i, seed in enumerate(seeds)]
