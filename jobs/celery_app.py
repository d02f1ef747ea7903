"""The Celery app. The database is the source of truth; messages are only tickets saying "work may be waiting".

Long GPU work: late acks (a ticket is acked after its batch is recorded), one prefetched ticket per worker, and a
ticket whose worker died goes back to the queue. A ticket that runs twice is harmless: a worker claims work from
the database, and an empty claim is a no-op.
"""

from __future__ import annotations

from celery import Celery

from jobs.settings import Settings

# Redis redelivers an unacked message after this long; it must exceed the longest batch (celery#2599).
VISIBILITY_TIMEOUT_S = 6 * 3600


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    app = Celery("reelbatch", broker=settings.broker_url, include=["jobs.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=settings.queue,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(settings.broker_url),
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
    )
    return app


def _transport_options(broker_url: str) -> dict:
    # Only brokers that redeliver after a visibility timeout take the option (the SQLite transport hands its
    # options to SQLAlchemy's create_engine, which refuses unknown keywords).
    if broker_url.split("://", 1)[0] in ("redis", "rediss", "sqs"):
        return {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    return {}


app = create_app()
