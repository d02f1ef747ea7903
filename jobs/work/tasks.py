"""Thin Celery tasks: take a ticket, call one plain function, let the database record the result."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from functools import lru_cache

from celery import Celery, current_app, shared_task
from celery.signals import (after_setup_logger, after_setup_task_logger, worker_process_init, worker_process_shutdown,
                            worker_ready, worker_shutdown)
from sqlalchemy.exc import InterfaceError, OperationalError

from engine.engine import Engine
from jobs.work import leases
from jobs.db.connect import session_factory
from jobs.cost.ledger import Meter
from jobs.render.batch import Finisher, render_next_batch, warm_up, worker_id
from jobs.settings import Settings
from jobs.work.sweeper import Sweeper

log = logging.getLogger(__name__)

# Set while this process renders, so its sweeper knows whether it is idle.
_busy = threading.Event()

# Tickets sent for one submission: each task claims a whole batch and passes the ticket on while work remains, so
# a few thousand tickets keep any realistic fleet busy; the sweepers cover the rest.
MAX_TICKETS = 5000


@lru_cache(maxsize=1)
def _worker_state() -> tuple[Settings, Engine]:
    """Settings and the engine, made once per worker process: the pipeline loads once and stays.

    Nothing here touches CUDA until the first render, which runs in the process that executes tasks (the prefork
    child or the solo worker), never in a parent that forks afterwards.
    """
    settings = Settings.from_env()
    return settings, Engine(settings.engine_config(), settings.registry())


@lru_cache(maxsize=1)
def _finisher() -> Finisher:
    """One per rendering process: batch k is stored while batch k+1 renders."""
    return Finisher()


@lru_cache(maxsize=1)
def _meter() -> Meter:
    """This rendering process's clock of paid time; its session opens when the process is ready (jobs.cost.ledger)."""
    settings = Settings.from_env()
    return Meter(settings.gpu_rate(), session_factory(settings.database_url), worker_id())


# A database that is restarting or briefly unreachable: retry the ticket with backoff. The batch it held keeps
# its lease until that expires, then the reaper hands it on; its stored objects are adopted, never duplicated.
@shared_task(name="reelbatch.render_next", acks_late=True, autoretry_for=(OperationalError, InterfaceError),
             retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=30)
def render_next() -> dict:
    settings, engine = _worker_state()
    factory = session_factory(settings.database_url)
    _busy.set()
    try:
        _compile_ahead(settings, engine, factory)
        app = render_next.app
        result = render_next_batch(settings, engine, factory, _finisher() if settings.overlap else None,
                                   on_ready=lambda n: send_tickets(n, app=app), meter=_meter())
    finally:
        _busy.clear()
    if result.claimed and leases.claimable(factory):
        send_tickets(1, app=render_next.app)
    return result.__dict__


_warmed = threading.Event()


def _compile_ahead(settings: Settings, engine: Engine, factory) -> None:
    """With compile on, a worker's first ticket compiles the shapes waiting in the queue before it claims (a claim's
    lease would otherwise tick through the compile)."""
    if settings.compile and not _warmed.is_set():
        _warmed.set()
        log.info("compiled ahead for %s", warm_up(settings, engine, factory) or "no waiting shapes")


def send_tickets(count: int, app: Celery | None = None, on_sent: Callable[[], None] | None = None) -> None:
    """Tickets only say "work may be waiting"; a ticket that finds nothing to claim returns at once.

    `app` defaults to the current app. Threads must pass theirs: Celery's current app is per thread, and a new
    thread would fall back to a default app on a broker nobody configured. `on_sent` is called after each ticket
    (a progress bar).
    """
    app = app or current_app
    for _ in range(min(count, MAX_TICKETS)):
        app.send_task("reelbatch.render_next")
        if on_sent is not None:
            on_sent()


@shared_task(name="reelbatch.fire_schedules")
def fire_schedules() -> int:
    """Sent by `reelbatch beat`: fire every schedule that is due. Idempotent: each fire time makes one run."""
    from jobs.work.schedules import fire_due

    settings = Settings.from_env()
    return len(fire_due(session_factory(settings.database_url), settings, datetime.now(timezone.utc)))


_sweeper_pid: int | None = None


def _start_sweeper() -> None:
    """One sweeper (and metrics endpoint) per process that renders. Idempotent: the solo pool sends both signals
    below (Celery 5.7)."""
    global _sweeper_pid
    if _sweeper_pid == os.getpid():
        return
    _sweeper_pid = os.getpid()
    settings = Settings.from_env()
    if settings.metrics_port:
        from billiard.process import current_process

        from jobs.work.prometheus import serve

        index = getattr(current_process(), "index", None)  # a prefork child's pool index; none in a solo worker
        serve(settings.metrics_port + (0 if index is None else index + 1))
    app = current_app._get_current_object()  # the worker's app, taken here in its main thread
    meter = _meter()
    try:
        meter.open()
    except Exception:  # noqa: BLE001 - the database is away: the first heartbeat that reaches it opens the session
        log.warning("could not open the worker session; the sweeper will", exc_info=True)
    Sweeper(settings, session_factory(settings.database_url), _busy, lambda n: send_tickets(n, app=app),
            meter).start()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _finish_stores(**_) -> None:
    """A warm shutdown stores the batch still in the finisher before the process exits, then closes its session."""
    if _finisher.cache_info().currsize:
        _finisher().wait()
    if _meter.cache_info().currsize:
        try:
            _meter().close()
        except Exception:  # noqa: BLE001 - the database is away: a sweeper closes the session from its last heartbeat
            log.warning("could not close the worker session", exc_info=True)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger=None, **_) -> None:
    if os.environ.get("REELBATCH_LOG_FORMAT") == "json":
        from jobs.work.logs import use_json

        use_json(logger)


@worker_process_init.connect
def _on_child_start(**_) -> None:
    _start_sweeper()  # prefork: each child renders, so each child sweeps


@worker_ready.connect
def _on_worker_ready(**_) -> None:
    if os.environ.get("REELBATCH_POOL", "solo") == "solo":
        _start_sweeper()  # solo: the worker process itself renders
