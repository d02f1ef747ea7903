"""Estimate: what a manifest will cost and when it will be done, checked as a submission is; writes nothing, not
even an empty database. What `reelbatch estimate` and POST /v1/estimate answer."""

from __future__ import annotations

from pathlib import Path

from jobs.cost import profiles
from jobs.cost.estimate import Estimator
from jobs.cost.forecast import estimate as forecast
from jobs.cost.projection import alive_workers, queued
from jobs.db.base import utcnow
from jobs.db.connect import session_factory, snapshots
from jobs.settings import Settings
from jobs.usecases.database import missing_file
from jobs.usecases.feedback import SILENT, Feedback
from jobs.usecases.submit import Options, read_manifest
from jobs.work.deadlines import LOST_AFTER_LEASES, QueueSnapshot


def estimate_manifest(settings: Settings, manifest: Path, options: Options = Options(), gpus: int | None = None,
                      feedback: Feedback = SILENT, queue: QueueSnapshot | None = None) -> dict:
    """The estimate's data (`estimate --json`): per shape and in total, each shape with the basis of its numbers.
    `queue`: a long-lived process's recent read of the whole queue (`serve`), so that an estimate does not read
    every pending unit of every team again."""
    spec = read_manifest(settings, manifest, options, feedback)
    bench = profiles.load(settings.engine.cache_dir)
    now = utcnow()
    factory = _ledger(settings.database_url)
    kwargs = dict(rate=settings.prices.gpu, storage=settings.prices.storage, now=now)
    if factory is None:
        return forecast(spec, Estimator(None, bench), workers=gpus or 0,
                        workers_source="--gpus" if gpus else "no database yet, so no worker", queue=[], **kwargs)
    with factory() as s:
        alive = alive_workers(s, now, LOST_AFTER_LEASES * settings.limits.lease_s)
        return forecast(spec, Estimator(s, bench), workers=gpus or alive,
                        workers_source="--gpus" if gpus else "workers alive now",
                        queue=queued(s) if queue is None else queue.rows(), **kwargs)


def _ledger(url: str):
    """The database's sessions; None when it is the embedded SQLite file and that does not exist yet."""
    if missing_file(url) is not None:
        return None
    return snapshots(session_factory(url))
