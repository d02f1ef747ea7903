"""Thin Celery tasks: take a ticket, call one plain function, let the database record the result."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

from celery import shared_task
from sqlalchemy.exc import InterfaceError, OperationalError

from jobs.claims import claims
from jobs.db.connect import session_factory
from jobs.render.batch import render_next_batch
from jobs.render.envelopes import measure_missing
from jobs.render.serving import warm_up
from jobs.work import process
from jobs.work.firing import fire_due
from jobs.work.tickets import RENDER_TASK, send_tickets

log = logging.getLogger(__name__)


# A database that is restarting or briefly unreachable: retry the ticket with backoff. The batch it held keeps
# its lease until that expires, then the reaper hands it on; its stored objects are adopted, never duplicated.
@shared_task(name=RENDER_TASK, acks_late=True, autoretry_for=(OperationalError, InterfaceError),
             retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=30)
def render_next() -> str:
    stopping = process.stopping()
    if not stopping.taking_work():
        # A ticket taken while this worker shuts down (Celery's solo pool takes one more message after a warm
        # shutdown begins; a prefork child may have one queued) goes back to the queue for another worker: sent
        # again, then acked. (Celery's Reject would do the same, logged as a warning with a traceback.)
        raise render_next.retry(countdown=0, max_retries=None)
    settings, engine = process.settings(), process.engine()
    factory = session_factory(settings.database_url)
    app = render_next.app
    process.busy.set()
    try:
        _before_first_claim(settings, engine, factory)
        result = render_next_batch(settings, engine, factory, process.finisher() if settings.worker.overlap else None,
                                   on_ready=lambda n, model: send_tickets(app, n, model), meter=process.meter(),
                                   stopping=stopping)
    finally:
        process.busy.clear()
    # Pass the ticket on, to the queue of a model this worker serves that has work waiting (this batch's first).
    last = engine.last_shape.model if engine.last_shape else None
    if result.claimed and (model := claims.next_model(factory, process.served(), prefer=last)) is not None:
        send_tickets(app, 1, model)
    # What Celery logs as the task's result: what the batch stored, or that the finisher is storing it (and logs
    # its outcome then), never `succeeded: 0` for videos about to be stored.
    return result.text()


_warmed = threading.Event()


def _before_first_claim(settings, engine, factory) -> None:
    """Before a worker's first claim: its missing memory envelopes measured (REELBATCH_ENVELOPE=measure), and with
    compile on or REELBATCH_WARM the shapes waiting in the queue rendered a step each (a claim's lease would
    otherwise tick through the compile)."""
    if _warmed.is_set():
        return
    _warmed.set()
    if settings.worker.envelope == "measure":
        measure_missing(settings, factory, engine.registry, process.served())
    if settings.engine.compile or settings.worker.warm:
        log.info("warmed up ahead for %s", warm_up(settings, engine, factory) or "no waiting shapes")


@shared_task(name="reelbatch.fire_schedules")
def fire_schedules() -> int:
    """Sent by `reelbatch beat`: fire every schedule that is due. Idempotent: each fire time makes one run."""
    settings, app = process.settings(), fire_schedules.app
    return len(fire_due(session_factory(settings.database_url), settings, datetime.now(timezone.utc),
                        lambda n, model: send_tickets(app, n, model)))
