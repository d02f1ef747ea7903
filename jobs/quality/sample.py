"""The toy world's fixed sample set: the prompt/seed pairs every quality measurement renders (`reelbatch quality`,
`bench quality`, the model card). Plain values, so commands can name them without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

from engine.toy.world import BACKGROUNDS, COLOURS, DIRECTIONS, SHAPES

SAMPLE_SIZE = 80
SEED_BASE = 7000


@dataclass(frozen=True)
class Case:
    prompt: str
    seed: int


def sample_set(count: int = SAMPLE_SIZE) -> list[Case]:
    """The first `count` cases of a fixed set. Case i takes colour i mod 5, shape i mod 2, direction (i // 2) mod 4
    and background (i // 8) mod 2: by the Chinese remainder theorem each of the 80 prompts appears once in any 80
    consecutive cases, and every 16 consecutive cases hold every attribute value."""
    colours, directions, backgrounds = list(COLOURS), list(DIRECTIONS), list(BACKGROUNDS)
    cases = []
    for i in range(count):
        prompt = (f"a {colours[i % 5]} {SHAPES[i % 2]} moving {directions[(i // 2) % 4]} "
                  f"on a {backgrounds[(i // 8) % 2]} background")
        cases.append(Case(prompt, SEED_BASE + i))
    return cases
