"""Overlap: a rendered batch is encoded, stored and recorded on a background thread while the next one renders."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchResult:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    pending: int = 0  # handed to a Finisher to encode and store; its result arrives from Finisher.wait()

    def text(self) -> str:
        """The batch's log line once its videos are recorded, e.g. `claimed 4: 3 stored, 1 failed, 0 to retry`
        (a video adopted from an earlier attempt's upload counts as stored; `handed back`: released with no attempt
        counted, only when there are any). A batch handed to a Finisher says so; its outcome is logged when stored."""
        back = f", {self.released} handed back" if self.released else ""
        if self.pending:  # the finisher logs their outcome once it has stored them
            before = f"; {self.failed} failed, {self.retried} to retry" if self.failed or self.retried else ""
            return f"claimed {self.claimed}: {self.pending} rendered, storing beside the next render{before}"
        return (f"claimed {self.claimed}: {self.succeeded} stored, {self.failed} failed, {self.retried} to retry"
                f"{back}")


class Finisher:
    """Encodes, stores and records rendered batches on one background thread while the caller renders the next.

    Bounded: `submit` first waits for the batch before, so at most one finished batch is held in memory besides the
    one rendering. Video encoding (libx264) and uploads release the GIL, so they really do run beside the denoiser.
    Nothing is lost if the process dies with a batch here: its units are still leased, so the reaper hands them on,
    and an upload that completed is adopted by its recorded hash rather than made twice.
    """

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="reelbatch-finish")
        self._pending: Future | None = None

    def submit(self, job: Callable[[], BatchResult]) -> BatchResult | None:
        """Queue `job`; returns the result of the job it waited for, if any."""
        before = self.wait()
        self._pending = self._pool.submit(job)
        return before

    def wait(self) -> BatchResult | None:
        """Block until the queued job (if any) is done and return its result."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()


def finish(store: Callable[[], BatchResult], held: ExitStack) -> BatchResult:
    """Run a batch's `store` on the finisher's thread, then close what the batch held (its lease keeper)."""
    with held:
        try:
            return store()
        except Exception:  # noqa: BLE001 - e.g. the database restarting: the units stay leased until the reaper
            log.exception("finishing a batch failed; its videos will be retried after their leases expire")
            return BatchResult()
