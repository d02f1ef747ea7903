"""An attempt's bookkeeping beyond its rows: what a failure decides, the retry backoff, the retry or the failure
itself, and the worker's metrics."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from enum import Enum

from typing_extensions import assert_never

from faults import Decision
from jobs.claims.claims import ClaimedUnit
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.observe import prometheus
from jobs.render import record
from jobs.render.record import VideoOutput
from jobs.settings import Settings

log = logging.getLogger(__name__)


class Attempt(Enum):
    """What a failed attempt came to for its video."""

    RETRIED = "retried"  # back to pending, after a backoff
    FAILED = "failed"  # failed for good (its last attempt, or a failure another attempt would meet again), or
    # cancelled with its run
    LEASE_LOST = "lease lost"  # another worker holds the unit now: nothing was written


def decide(exc: BaseException) -> Decision:
    """What a failure means for the videos whose attempt raised it: the one place the worker reads it. An error
    reelbatch raises on purpose carries its decision (faults.Decision: engine.errors, storage.base); anything else,
    a bug or an outage (a database away, a driver's error), is retried, as it may pass."""
    decision = getattr(type(exc), "decision", None)
    return decision if isinstance(decision, Decision) else Decision.RETRY


def error_text(exc: BaseException) -> str:
    """A failure as its video records it: `ObjectConflict: ...` (reports group failures by the class name)."""
    return f"{type(exc).__name__}: {exc}"


def backoff(settings: Settings, attempts: int) -> float:
    """The wait before a retry: the first retry's, doubled per attempt after it, capped at 10 minutes."""
    return min(settings.limits.retry_backoff_s * 2 ** max(attempts - 1, 0), 600.0)


def retry(settings: Settings, factory: Factory, unit: ClaimedUnit, error: str, meter: Meter, *, solo: bool = False,
          spent: float = 0.0) -> Attempt:
    """A failed attempt that may pass: retried, or failed past the last attempt; the `spent` seconds it took are
    charged to its video (kind "retry")."""
    outcome = record.record_retry(factory, unit, error, max_attempts=settings.limits.max_attempts,
                                  backoff_s=backoff(settings, unit.attempts), solo=solo, spent_s=spent,
                                  rate=meter.rate, session_id=meter.session_id)
    if outcome is None:
        return Attempt.LEASE_LOST
    prometheus.VIDEOS.labels("retried" if outcome else "failed").inc()
    prometheus.GPU_SECONDS.inc(spent)
    return Attempt.RETRIED if outcome else Attempt.FAILED


def fail_now(factory: Factory, unit: ClaimedUnit, error: str, meter: Meter, *, spent: float = 0.0) -> Attempt:
    """A failed attempt that another would meet again: the video fails now with `error`, its reason, and no attempt
    is left to spend on it; the `spent` seconds are charged as a retry's are."""
    if not record.record_failure(factory, unit, error, spent, meter.rate, meter.session_id):
        return Attempt.LEASE_LOST
    prometheus.VIDEOS.labels("failed").inc()
    prometheus.GPU_SECONDS.inc(spent)
    return Attempt.FAILED


def tally(outcomes: Iterable[Attempt]) -> tuple[int, int]:
    """How many of the failed attempts were retried and how many failed (a lost lease counts in neither)."""
    retried = failed = 0
    for outcome in outcomes:
        match outcome:
            case Attempt.RETRIED:
                retried += 1
            case Attempt.FAILED:
                failed += 1
            case Attempt.LEASE_LOST:
                pass
            case _:
                assert_never(outcome)
    return retried, failed


def charge_released(factory: Factory, unit: ClaimedUnit, kind: str, spent: float, meter: Meter) -> None:
    """Charge the seconds a render spent before it stopped and gave its unit back (the release records no attempt):
    `kind` says why ("cancelled", "preempted", "interrupted")."""
    try:
        record.record_charge(factory, unit.video_id, kind, spent, meter.rate, meter.session_id)
    except Exception:  # noqa: BLE001 - the database is away: these seconds stay in the session's idle time
        log.warning("could not charge %.1f s to video %s", spent, unit.key, exc_info=True)
        return
    prometheus.GPU_SECONDS.inc(spent)


def count_success(out: VideoOutput) -> float | None:
    """A stored video in the metrics; returns this process's cold start when it is its first (else None)."""
    prometheus.VIDEOS.labels("succeeded").inc()
    first = prometheus.cold_start("first_video")
    prometheus.GPU_SECONDS.inc(out.charged_s)
    for stage, seconds in {**out.stages, "encode": out.encode_s, "upload": out.upload_s}.items():
        if seconds is not None:
            prometheus.STAGE_SECONDS.labels(stage).observe(seconds)
    return first
