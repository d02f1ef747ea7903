"""The stage clock: seconds per render stage (text, denoise, decode), carried on each RenderedVideo as its
`stages`.

Apart from engine.engine because timing on a GPU has its own rule (wait for the device before reading the clock),
and one place should hold it.
"""

from __future__ import annotations

import time

import torch


class StageClock:
    """Seconds per stage; waits for the device at each lap so queued GPU work is charged to the stage that queued it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.laps[stage] = self.laps.get(stage, 0.0) + now - self._last
        self._last = now
