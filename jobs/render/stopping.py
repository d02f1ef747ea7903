"""A worker's shutdown, as the render path sees it: whether the process still takes work, and whether the batch in
hand must stop at its next step.

The phase moves one way: WORKING -> FINISHING (the first SIGTERM or Ctrl-C: take no new work, finish the batch in
hand) -> STOPPING (a second signal, or the `reelbatch run` that started the worker is gone: stop the batch at its
next step and hand it back). FINISHING with a grace stops the batch too when what is left of it cannot be done
before the grace runs out (a spot instance's notice). The signal handlers that move it are in jobs.work.shutdown.

The phase and the grace's deadline live in an anonymous shared mapping made before a prefork worker forks, so its
rendering children see what the parent's signal handler wrote. Deadlines are on time.monotonic, one clock for
every process of a machine (CLOCK_MONOTONIC on Linux).
"""

from __future__ import annotations

import ctypes
import enum
import json
import math
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class Phase(enum.IntEnum):
    WORKING = 0  # claims work
    FINISHING = 1  # claims nothing more; the batch in hand finishes (within the grace, if there is one)
    STOPPING = 2  # the batch in hand stops at its next step and is handed back


@dataclass
class BatchProgress:
    """The render in hand, step by step (the lease keeper counts a step each time the engine asks it)."""

    videos: int
    steps: int
    started: float
    done: int = 0
    first_step: float | None = None
    last_step: float | None = None
    rendered: bool = False  # the steps are done: decoding, encoding, storing
    loaded: float | None = None  # the model is loaded and the render begins (prompts, then the first step)

    def step(self, now: float) -> None:
        self.done += 1
        self.first_step = self.first_step if self.first_step is not None else now
        self.last_step = now

    def step_s(self, from_first: bool = False) -> float | None:
        """Seconds per step, measured between steps. With `from_first`, one step measures too, counted from the
        model's load (`loaded`): an upper bound, since it also carries the prompts' encoding and a first call's
        warm-up; a message may say it, but the grace decision waits for a second step."""
        if self.done >= 2 and self.last_step is not None and self.first_step is not None:
            return (self.last_step - self.first_step) / (self.done - 1)
        if from_first and self.done == 1 and self.first_step is not None and self.loaded is not None:
            return self.first_step - self.loaded
        return None

    def steps_left(self) -> int:
        """Steps left in the render in progress. An out-of-memory split renders the batch in parts of `steps`
        steps each: this counts the part in progress."""
        return 0 if self.rendered else (-self.done) % self.steps


@dataclass(frozen=True)
class InHand:
    """What a shutdown message says about the batch in hand."""

    videos: int = 0
    step: int = 0
    steps: int = 0
    left_s: float | None = None  # until it is recorded; None: not measured yet (no step done)
    stage: str = "idle"  # idle (no batch), starting (no step yet), rendering, storing
    tail_known: bool = True  # left_s includes the decode and store (measured on a batch this worker recorded)

    def text(self, estimate: bool = True) -> str:
        """E.g. `the batch in hand (4 videos, step 37 of 100), about 12 s`."""
        if self.stage == "idle":
            return "no batch in hand"
        what = f"{self.videos} video{'s' if self.videos != 1 else ''}"
        where = {"starting": "not at its first step yet", "storing": "storing"}.get(
            self.stage, f"step {self.step} of {self.steps}")
        if self.left_s is None or (self.stage == "storing" and not self.tail_known):
            about = "its time is not measured yet"
        else:
            about = f"about {math.ceil(self.left_s)} s" + ("" if self.tail_known else
                                                           " of steps, then its decode and store")
        return f"the batch in hand ({what}, {where})" + (f", {about}" if estimate else "")


class Stopping:
    """One worker process's shutdown state (and its prefork children's), and the progress of its batch in hand."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._shared = mmap.mmap(-1, 16)  # MAP_SHARED | MAP_ANONYMOUS: inherited by forked children
        self._cells = (ctypes.c_double * 2).from_buffer(self._shared)  # [phase, deadline]
        self._cells[1] = math.inf
        self.in_hand: BatchProgress | None = None
        # Seconds from the last step of this process's previous batch to its record (decode, encode, upload):
        # what follows the steps of the next one.
        self.tail_s: float | None = None
        # Told the batch in hand after each of its denoising steps, and None when it is no longer in hand: how
        # `reelbatch run`'s bar moves per step (jobs.work.shutdown writes it for `run` to read).
        self.on_progress: Callable[[BatchProgress | None], None] | None = None

    # ---- the signal side (jobs.work.shutdown) --------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return Phase(int(self._cells[0]))

    @property
    def deadline(self) -> float:
        return self._cells[1]

    def finish(self, grace_s: float | None = None) -> None:
        """Take no new work; finish the batch in hand, within `grace_s` seconds from now if given."""
        if self.phase is Phase.WORKING:
            self._cells[1] = math.inf if grace_s is None else self.clock() + grace_s
            self._cells[0] = Phase.FINISHING

    def stop_now(self) -> None:
        self._cells[0] = Phase.STOPPING

    def taking_work(self) -> bool:
        return self.phase is Phase.WORKING

    # ---- the render side (jobs.render.keeper, jobs.render.batch) -------------------------------------------------

    def begin(self, videos: int, steps: int) -> BatchProgress:
        """A batch's render starts: it is the batch in hand."""
        self.in_hand = BatchProgress(videos, steps, self.clock())
        return self.in_hand

    def left_s(self, progress: BatchProgress, now: float, from_first: bool = False) -> float | None:
        """Seconds until `progress`'s batch is recorded, counted from its last step: the steps left at the measured
        step time, then what followed the steps of the previous batch (none known before one is recorded).
        None before its second step, or with `from_first` (what a message says) before its first."""
        per_step = progress.step_s(from_first)
        if per_step is None or progress.last_step is None:
            return None
        after = per_step * progress.steps_left() + (self.tail_s or 0.0)
        return max(0.0, after - (now - progress.last_step))

    def covers(self, progress: BatchProgress, now: float) -> bool:
        """Does the grace leave time to finish this batch? Unmeasured (no step yet) counts as yes until it is."""
        left = self.left_s(progress, now)
        return left is None or now + left <= self.deadline

    def loaded(self, progress: BatchProgress) -> None:
        """The batch's model is loaded: its first step is timed from here."""
        progress.loaded = self.clock()

    def rendered(self, progress: BatchProgress) -> None:
        progress.rendered = True

    def recorded(self, progress: BatchProgress) -> None:
        """The batch is stored and recorded: its time after the last step is the next batch's tail."""
        if progress.last_step is not None:
            self.tail_s = self.clock() - progress.last_step
        self.dropped(progress)

    def stepped(self, progress: BatchProgress) -> None:
        """A denoising step of `progress`'s batch is done (counted already: BatchProgress.step)."""
        if self.on_progress is not None:
            self.on_progress(progress)

    def dropped(self, progress: BatchProgress) -> None:
        """The batch is no longer in hand (recorded, stopped, or failed)."""
        if self.in_hand is progress:
            self.in_hand = None
            if self.on_progress is not None:
                self.on_progress(None)

    def describe(self) -> InHand:
        progress, now = self.in_hand, self.clock()
        if progress is None:
            return InHand()
        stage = "storing" if progress.rendered else "rendering" if progress.done else "starting"
        return InHand(progress.videos, min(progress.done, progress.steps), progress.steps,
                      self.left_s(progress, now, from_first=True), stage, self.tail_s is not None)


def steps_file(notices: Path) -> Path:
    """Where the worker `reelbatch run` started says how far its batch in hand is, beside its notices file."""
    return notices.with_suffix(".steps")


def write_steps(path: Path, progress: BatchProgress | None) -> None:
    """The batch in hand's videos and steps done (Stopping.on_progress), replaced whole so a reader never sees half
    of it; removed when no batch is in hand."""
    if progress is None:
        path.unlink(missing_ok=True)
        return
    part = path.with_suffix(".steps-part")
    part.write_text(json.dumps({"videos": progress.videos, "done": progress.done, "steps": progress.steps}))
    os.replace(part, path)


def read_steps(path: Path) -> float:
    """How many videos' worth of the batch in hand its steps have done (videos x fraction of its steps), 0.0 when
    none is in hand."""
    try:
        seen = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return 0.0
    # An out-of-memory split renders in parts of `steps` each: the part in hand.
    done = seen["done"] % seen["steps"] or (seen["steps"] if seen["done"] else 0)
    return seen["videos"] * done / seen["steps"]
