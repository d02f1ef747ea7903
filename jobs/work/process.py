"""A worker process's own state and life: its settings (given by the `reelbatch worker` command, never written into
the environment), its engine, finisher and paid-time meter, made once; and the Celery signal hooks that start its
sweeper when it is ready and store the batch in hand when it shuts down. Nothing here touches CUDA until the first
render, which runs in the process that executes tasks (the prefork child or the solo worker), never in a parent that
forks afterwards."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from billiard.process import current_process
from celery import current_app
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from engine.engine import Engine
from jobs.cost.meter import Meter
from jobs.cost.prices import Rate
from jobs.db.connect import session_factory
from jobs.db.queries import UNGATED_MARK
from jobs.observe import logs
from jobs.observe.identity import worker_id
from jobs.observe.prometheus import serve, watch_busy
from jobs.render.finisher import Finisher
from jobs.render.serving import gated_models
from jobs.render.stopping import Stopping
from jobs.settings import Settings
from jobs.work import shutdown
from jobs.work.sweeper import Sweeper
from jobs.work.tickets import send_tickets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    """How the `reelbatch worker` command started this process."""

    settings: Settings
    pool: str = "solo"  # solo renders in this process; prefork in its children
    log_format: str = "text"
    grace_s: float | None = None  # after SIGTERM, a batch that cannot finish within this stops (None: it finishes)
    parent_pid: int | None = None  # the `reelbatch run` that started this worker: it stops when that is gone
    notices: Path | None = None  # where `reelbatch run` reads what a signal made this worker do (JSON lines)


_options: WorkerOptions | None = None

# Set while this process renders, so its sweeper knows whether it is idle.
busy = threading.Event()


def configure(options: WorkerOptions) -> None:
    """Called once by the worker command before Celery starts; prefork children inherit it when they fork, and
    the shutdown state with it (jobs.render.stopping: made here, so they share its memory)."""
    global _options
    _options = options
    _connect_signals()
    _install_shutdown()
    if options.parent_pid is not None:
        shutdown.watch_parent(options.parent_pid)


def options() -> WorkerOptions:
    """This process's options; outside a worker command (a test's in-thread worker), read once from the environment."""
    global _options
    if _options is None:
        _options = WorkerOptions(Settings.from_env())
    return _options


def settings() -> Settings:
    return options().settings


@lru_cache(maxsize=1)
def engine() -> Engine:
    """The engine, made once per worker process: each pipeline loads once and stays. With a layout of several ranks
    (REELBATCH_ULYSSES, REELBATCH_CFG_PARALLEL) this process is rank 0 of a group it starts (engine.group): a rank
    that stops answering within the lease time ends the group, and its batch comes back."""
    config = settings().engine_config()
    if config.ulysses * config.cfg_parallel * config.ring > 1:
        from engine.group import GroupEngine

        # The group's collective timeout: the lease, but time enough for the other ranks to start and join.
        return GroupEngine(config, settings().registry(), timeout_s=max(settings().limits.lease_s, 120.0))
    return Engine(config, settings().registry())


@lru_cache(maxsize=1)
def stopping() -> Stopping:
    """This worker's shutdown state (jobs.work.shutdown's signal handlers move it; the render path reads it)."""
    return Stopping()


@lru_cache(maxsize=1)
def finisher() -> Finisher:
    """One per rendering process: batch k is stored while batch k+1 renders."""
    return Finisher()


@lru_cache(maxsize=1)
def gated() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Of the models this worker is to serve (`--models`, else every registered one), those whose gates let its
    engine render them, and those they do not (jobs.render.serving.gated_models), as the worker started."""
    return gated_models(engine(), settings().served_models())


def gated_now() -> tuple[str, ...]:
    """The models this worker may render now (a gate recorded since it started counts), its session's record of
    them brought up to date at the next heartbeat; asked at each sweep."""
    ok, ungated = gated_models(engine(), settings().served_models(engine().registry))
    if meter.cache_info().currsize:
        meter().models = ok + tuple(UNGATED_MARK + m for m in ungated)
    return ok


def served() -> tuple[str, ...]:
    """The models this worker serves: it claims only their work."""
    return gated()[0]


@lru_cache(maxsize=1)
def meter() -> Meter:
    """This rendering process's clock of paid time; its session opens when the process is ready (jobs.cost.ledger)
    and records the models it serves, and those it lacks a gate for marked UNGATED_MARK (`reelbatch status` names
    pending work that no live session serves, and why)."""
    models = served() + tuple(UNGATED_MARK + m for m in gated()[1])
    return Meter(group_rate(settings()), session_factory(settings().database_url), worker_id(), models=models)


def group_rate(config: Settings) -> Rate:
    """A worker's rate: REELBATCH_GPU_HOUR_USD for each GPU it holds (a worker of several ranks on GPUs holds one a
    rank, so its videos cost that many GPU-hours an hour; ranks on a CPU share its cores, so the rate stays one)."""
    rate, engine_config = config.prices.gpu, config.engine
    ranks = engine_config.ulysses * engine_config.cfg_parallel * engine_config.ring
    if ranks == 1 or engine_config.torch_device().type != "cuda":
        return rate
    return Rate(rate.usd_per_hour * ranks, f"{rate.source}; x {ranks} GPUs (one worker of {ranks} ranks)")


_sweeper_pid: int | None = None


def start_sweeper() -> None:
    """One sweeper (and metrics endpoint) per process that renders. Idempotent: the solo pool sends both signals
    below (Celery 5.7)."""
    global _sweeper_pid
    if _sweeper_pid == os.getpid():
        return
    _sweeper_pid = os.getpid()
    config = settings()
    if config.worker.metrics_port:
        index = getattr(current_process(), "index", None)  # a prefork child's pool index; none in a solo worker
        serve(config.worker.metrics_port + (0 if index is None else index + 1))
        watch_busy(busy)
    app = current_app._get_current_object()  # the worker's app, taken here in its main thread
    paid = meter()
    try:
        paid.open()
    except Exception:  # noqa: BLE001 - the database is away: the first heartbeat that reaches it opens the session
        log.warning("could not open the worker session; the sweeper will", exc_info=True)
    Sweeper(config, session_factory(config.database_url), busy, lambda n, model: send_tickets(app, n, model), paid,
            models=gated_now).start()


def finish_stores(**_) -> None:
    """A warm shutdown stores the batch still in the finisher before the process exits, then closes its session."""
    if finisher.cache_info().currsize:
        finisher().wait()
    if engine.cache_info().currsize and hasattr(engine(), "group"):
        engine().group.close()  # its other ranks quit with it
    if meter.cache_info().currsize:
        try:
            meter().close()
        except Exception:  # noqa: BLE001 - the database is away: a sweeper closes the session from its last heartbeat
            log.warning("could not close the worker session", exc_info=True)


def _json_logs(logger=None, **_) -> None:
    if options().log_format == "json":
        logs.use_json(logger)


def _install_shutdown() -> None:
    o = options()
    shutdown.install(stopping(), grace_s=o.grace_s, pool=o.pool, notices=o.notices, parent_pid=o.parent_pid)


def _on_child_start(**_) -> None:
    shutdown.leave_to_parent()
    start_sweeper()  # prefork: each child renders, so each child sweeps


def _on_worker_ready(**_) -> None:
    _install_shutdown()  # again: Celery has installed its own handlers since
    if options().pool == "solo":
        start_sweeper()  # solo: the worker process itself renders


_connected = False


def _connect_signals() -> None:
    global _connected
    if _connected:
        return
    _connected = True
    worker_process_shutdown.connect(finish_stores, weak=False)
    worker_shutdown.connect(finish_stores, weak=False)
    after_setup_logger.connect(_json_logs, weak=False)
    after_setup_task_logger.connect(_json_logs, weak=False)
    worker_process_init.connect(_on_child_start, weak=False)
    worker_ready.connect(_on_worker_ready, weak=False)
