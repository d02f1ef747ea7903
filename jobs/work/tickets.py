"""Tickets: Celery messages that only say "work may be waiting". The database decides who renders what, so a lost,
duplicated or redelivered ticket changes nothing, and a ticket that finds nothing to claim returns at once.

A ticket for a model's work goes to that model's queue, `{queue}.model.{model}`, and a worker consumes the queues of
the models it serves (and the plain queue), so a ticket wakes only a worker that can claim the work it announces.
"""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

# Tickets sent for one submission: each task claims a whole batch and passes the ticket on while work remains, so
# a few thousand tickets keep any realistic fleet busy; the sweepers cover the rest.
MAX_TICKETS = 5000
RENDER_TASK = "reelbatch.render_next"
# Tickets a request over the API sends before it answers (a new run's submit, a resume): enough to wake a fleet of
# this many workers at once; the rest follow after the answer (jobs.usecases.submit.send_more_tickets). On the SQLite
# broker 100 take about 0.6 s, 5,000 about 30 s.
FIRST_TICKETS = 100


def model_queue(queue: str, model: str) -> str:
    """The queue of one model's tickets under `queue` (REELBATCH_QUEUE). `.model.` keeps it apart from the control
    queue (`{queue}.control`) whatever the model is called."""
    return f"{queue}.model.{model}"


def send_tickets(app: Celery, count: int, model: str | None = None,
                 on_sent: Callable[[], None] | None = None) -> int:
    """Send up to MAX_TICKETS render tickets through `app`'s broker, to `model`'s queue (None: the plain queue, which
    every worker consumes); `on_sent` is called after each (a progress bar). Returns how many were sent. Sent by
    name, so the sender never imports the tasks (or torch)."""
    sent = min(count, MAX_TICKETS)
    options = {} if model is None else {"queue": model_queue(app.conf.task_default_queue, model)}
    for _ in range(sent):
        app.send_task(RENDER_TASK, **options)
        if on_sent is not None:
            on_sent()
    return sent
