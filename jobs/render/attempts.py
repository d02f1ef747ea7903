"""An attempt's bookkeeping beyond its rows: the retry backoff, the retry itself, and the worker's metrics."""

from __future__ import annotations

import logging

from jobs.claims.claims import ClaimedUnit
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.observe import prometheus
from jobs.render import record
from jobs.render.record import VideoOutput
from jobs.settings import Settings

log = logging.getLogger(__name__)


def backoff(settings: Settings, attempts: int) -> float:
    """The wait before a retry: the first retry's, doubled per attempt after it, capped at 10 minutes."""
    return min(settings.retry_backoff_s * 2 ** max(attempts - 1, 0), 600.0)


def retry(settings: Settings, factory: Factory, unit: ClaimedUnit, error: str, meter: Meter, *, solo: bool = False,
          spent: float = 0.0) -> bool | None:
    """A failed attempt, retried or failed; the `spent` seconds it took are charged to its video (kind "retry")."""
    outcome = record.record_retry(factory, unit, error, max_attempts=settings.max_attempts,
                                  backoff_s=backoff(settings, unit.attempts), solo=solo, spent_s=spent,
                                  rate=meter.rate, session_id=meter.session_id)
    if outcome is not None:
        prometheus.VIDEOS.labels("retried" if outcome else "failed").inc()
        prometheus.GPU_SECONDS.inc(spent)
    return outcome


def charge_released(factory: Factory, unit: ClaimedUnit, kind: str, spent: float, meter: Meter) -> None:
    """Charge the seconds a render spent before it stopped and gave its unit back (the release records no attempt):
    `kind` says why ("cancelled", "preempted", "interrupted")."""
    try:
        record.record_charge(factory, unit.video_id, kind, spent, meter.rate, meter.session_id)
    except Exception:  # noqa: BLE001 - the database is away: these seconds stay in the session's idle time
        log.warning("could not charge %.1f s to video %s", spent, unit.key, exc_info=True)
        return
    prometheus.GPU_SECONDS.inc(spent)


def count_success(out: VideoOutput) -> None:
    prometheus.VIDEOS.labels("succeeded").inc()
    prometheus.GPU_SECONDS.inc(out.charged_s)
    for stage, seconds in {**out.stages, "encode": out.encode_s, "upload": out.upload_s}.items():
        if seconds is not None:
            prometheus.STAGE_SECONDS.labels(stage).observe(seconds)
