"""The Celery app. The database is the source of truth; messages are only tickets saying "work may be waiting".

Long GPU work: late acks (a ticket is acked after its batch is recorded), one prefetched ticket per worker, and a
ticket whose worker died goes back to the queue. A ticket that runs twice is harmless: a worker claims work from
the database, and an empty claim is a no-op.
"""

from __future__ import annotations

from celery import Celery

from jobs.errors import UsageError
from jobs.settings import Settings
from jobs.work.tickets import RENDER_TASK


def create_app(settings: Settings) -> Celery:
    """The app for `settings`' broker and queues. Nothing is configured at import time: the worker, the beat and
    every command that sends tickets make their own, from the settings they read."""
    app = Celery("reelbatch", broker=settings.broker_url, include=["jobs.work.tasks"], set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=settings.worker.queue,
        # Rendering goes only to the queue GPU workers consume (`reelbatch worker --queue`).
        # Schedule firings go to a small control queue every worker also consumes, so a firing never waits behind
        # thousands of render tickets.
        task_routes={RENDER_TASK: {"queue": settings.worker.queue},
                     "reelbatch.fire_schedules": {"queue": control_queue(settings)}},
        task_time_limit=settings.limits.max_render_s,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(settings),
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        # Task events, so Flower (or `celery events`) can watch the workers.
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return app


def control_queue(settings: Settings) -> str:
    return f"{settings.worker.queue}.control"


def declare_queues(app: Celery, names: list[str]) -> None:
    """Declare the queues a worker is about to consume, before its consumer starts. Kombu's SQLite transport makes a
    queue's row on first use behind a lock of one process only, so two workers that start together (two `reelbatch
    worker` on one machine, `run` beside a worker) both insert the row, and the loser's consumer dies on the unique
    constraint. Here the loser finds the winner's row on its second look. Other brokers declare as they always do, in
    the consumer."""
    if not _on_sqlite_transport(app):
        return
    import sqlalchemy.exc
    from kombu import Queue

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for name in names:
            for attempt in range(3):
                try:
                    Queue(name, channel=channel).declare()
                    break
                except sqlalchemy.exc.IntegrityError:
                    channel.session.rollback()  # the other process's row is there now: look again
                    if attempt == 2:
                        raise


def _on_sqlite_transport(app: Celery) -> bool:
    return str(app.conf.broker_url).startswith("sqla+")


def _redelivers(broker_url: str) -> bool:
    return broker_url.split("://", 1)[0] in ("redis", "rediss", "sqs")


def _transport_options(settings: Settings) -> dict:
    # Only brokers that redeliver after a visibility timeout take the option (the SQLite transport hands its
    # options to SQLAlchemy's create_engine, which refuses unknown keywords). A redelivered ticket is harmless here
    # (the database decides who renders what), but a timeout shorter than a batch would waste tickets.
    return {"visibility_timeout": settings.limits.visibility_timeout_s} if _redelivers(settings.broker_url) else {}


def check_worker_config(settings: Settings) -> None:
    """Refuse to start a worker whose broker would hand a running ticket to a second worker."""
    limits = settings.limits
    if _redelivers(settings.broker_url) and limits.visibility_timeout_s <= limits.max_render_s:
        raise UsageError(
            f"the broker's visibility timeout ({limits.visibility_timeout_s:g} s, REELBATCH_VISIBILITY_TIMEOUT_S) "
            f"must exceed the longest allowed render ({limits.max_render_s:g} s, REELBATCH_MAX_RENDER_S), or long "
            "batches are delivered twice; raise the first or lower the second"
        )
    if settings.limits.lease_s < 3:
        raise UsageError(f"REELBATCH_LEASE_S={settings.limits.lease_s:g} is too short to renew; use at least 3 seconds")

