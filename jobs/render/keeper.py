"""A claim's leases, renewed in the background while its batch renders and until it is recorded."""

from __future__ import annotations

import enum
import logging
import threading
import time

from jobs.claims import leases
from jobs.claims.claims import Claim
from jobs.db.queries import Factory
from jobs.render.stopping import BatchProgress, Phase, Stopping

log = logging.getLogger(__name__)

# How often a rendering batch asks whether one of its runs was cancelled (at its next denoising step after this
# many seconds). Each ask is a statement and a transaction: at once a second they were half of everything a worker
# sent PostgreSQL (docs/SCALE.md); at 5 s a cancel still stops a batch within seconds, and a fleet's statements per
# GPU fall by about 40%.
CANCEL_CHECK_S = 5.0


class Stop(str, enum.Enum):
    """Why a batch's render stops at its next step (the engine raises RenderInterrupted with it)."""

    LEASE_LOST = "lease lost"  # another worker holds the units now; write nothing
    TIME_LIMIT = "time limit"  # the batch outlived its limit: a failed attempt, retried
    CANCELLED = "cancelled"  # a run of the batch was cancelled: give the units back
    PREEMPTED = "preempted"  # the worker is stopping and its grace cannot cover the rest: give the units back
    INTERRUPTED = "interrupted"  # the worker was told to stop now (a second signal): give the units back


class LeaseKeeper:
    """Renews a claim's leases while it is held (a `with` block), and says when the render should stop.

    It stops renewing at the batch's deadline, so even a worker stuck inside a kernel loses its lease and the
    reaper hands the work to another worker. With a `stopping` (the worker's shutdown state), it counts the steps
    of the batch and stops it when the worker must stop now or its grace cannot cover the rest.
    """

    def __init__(self, factory: Factory, claim: Claim, lease_s: float, deadline: float,
                 stopping: Stopping | None = None):
        self.factory, self.claim, self.lease_s, self.deadline = factory, claim, lease_s, deadline
        self.stopping = stopping
        self.progress: BatchProgress | None = None
        self.run_ids = {u.run_id for u in claim.units}
        self.lost = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-keeper", daemon=True)
        # Not at the first step: the claim that just took these units found their runs not cancelled (a cancel
        # takes a run's waiting units with it), so the first ask is CANCEL_CHECK_S after it, as every later one.
        self._next_cancel_check = time.monotonic() + CANCEL_CHECK_S

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.stopping is not None and self.progress is not None:
            self.stopping.dropped(self.progress)
        self._done.set()
        self._thread.join(timeout=10)

    def _renew_loop(self) -> None:
        while not self._done.wait(self.lease_s / 3) and time.monotonic() < self.deadline:
            try:
                held = leases.renew(self.factory, self.claim.units, self.lease_s)
            except Exception:  # noqa: BLE001 - the database may be restarting; the next renewal tries again
                log.warning("lease renewal failed; retrying", exc_info=True)
                continue
            if len(held) < len(self.claim.units):
                self.lost = True
                return

    def rendering(self, videos: int) -> BatchProgress | None:
        """The render of `videos` of the batch starts (the rest were adopted): its steps are counted from here."""
        if self.stopping is not None:
            self.progress = self.stopping.begin(videos, self.claim.batch.shape.steps)
        return self.progress

    def should_stop(self) -> Stop | None:
        if self.lost:
            return Stop.LEASE_LOST
        now = time.monotonic()
        if now > self.deadline:
            return Stop.TIME_LIMIT
        if self.stopping is not None and self.progress is not None:
            stepped = self.stopping.clock()
            self.progress.step(stepped)
            self.stopping.stepped(self.progress)
            match self.stopping.phase:
                case Phase.STOPPING:
                    return Stop.INTERRUPTED
                case Phase.FINISHING if not self.stopping.covers(self.progress, stepped):
                    return Stop.PREEMPTED
        if now >= self._next_cancel_check:  # at most every CANCEL_CHECK_S, however fast the steps are
            self._next_cancel_check = now + CANCEL_CHECK_S
            if leases.cancelled_runs(self.factory, self.run_ids):
                return Stop.CANCELLED
        return None
