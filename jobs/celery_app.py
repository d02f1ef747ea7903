"""The Celery app. The database is the source of truth; messages are only tickets saying "work may be waiting".

Long GPU work: late acks (a ticket is acked after its batch is recorded), one prefetched ticket per worker, and a
ticket whose worker died goes back to the queue. A ticket that runs twice is harmless: a worker claims work from
the database, and an empty claim is a no-op.
"""

from __future__ import annotations

import os

from celery import Celery

from jobs.errors import UsageError
from jobs.settings import Settings

# Redis (and SQS) redeliver an unacked message after this long; it must exceed the longest task, or a long batch's
# ticket runs twice (celery#2599). A second run is harmless here, but wasteful.
VISIBILITY_TIMEOUT_S = int(os.environ.get("REELBATCH_VISIBILITY_TIMEOUT_S", 6 * 3600))
# The hard limit on one task (prefork kills the child past it): the longest batch a worker may render.
MAX_RENDER_S = int(os.environ.get("REELBATCH_MAX_RENDER_S", 4 * 3600))


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    app = Celery("reelbatch", broker=settings.broker_url, include=["jobs.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=settings.queue,
        # Rendering goes only to the queue GPU workers consume (`reelbatch worker --queue`).
        task_routes={"reelbatch.render_next": {"queue": settings.queue},
                     "reelbatch.fire_schedules": {"queue": settings.queue}},
        task_time_limit=MAX_RENDER_S,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(settings.broker_url),
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        # Task events, so Flower (or `celery events`) can watch the workers.
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return app


def _redelivers(broker_url: str) -> bool:
    return broker_url.split("://", 1)[0] in ("redis", "rediss", "sqs")


def _transport_options(broker_url: str) -> dict:
    # Only brokers that redeliver after a visibility timeout take the option (the SQLite transport hands its
    # options to SQLAlchemy's create_engine, which refuses unknown keywords).
    return {"visibility_timeout": VISIBILITY_TIMEOUT_S} if _redelivers(broker_url) else {}


def check_worker_config(settings: Settings) -> None:
    """Refuse to start a worker whose broker would hand a running ticket to a second worker."""
    if _redelivers(settings.broker_url) and VISIBILITY_TIMEOUT_S <= MAX_RENDER_S:
        raise UsageError(
            f"the broker's visibility timeout ({VISIBILITY_TIMEOUT_S} s, REELBATCH_VISIBILITY_TIMEOUT_S) must exceed "
            f"the longest allowed render ({MAX_RENDER_S} s, REELBATCH_MAX_RENDER_S), or long batches are delivered "
            "twice; raise the first or lower the second"
        )
    if settings.lease_s < 3:
        raise UsageError(f"REELBATCH_LEASE_S={settings.lease_s:g} is too short to renew; use at least 3 seconds")


app = create_app()
