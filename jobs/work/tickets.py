"""Tickets: Celery messages that only say "work may be waiting". The database decides who renders what, so a lost,
duplicated or redelivered ticket changes nothing, and a ticket that finds nothing to claim returns at once."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

# Tickets sent for one submission: each task claims a whole batch and passes the ticket on while work remains, so
# a few thousand tickets keep any realistic fleet busy; the sweepers cover the rest.
MAX_TICKETS = 5000
RENDER_TASK = "reelbatch.render_next"


def send_tickets(app: Celery, count: int, on_sent: Callable[[], None] | None = None) -> int:
    """Send up to MAX_TICKETS render tickets through `app`'s broker; `on_sent` is called after each (a progress bar).
    Returns how many were sent. Sent by name, so the sender never imports the tasks (or torch)."""
    sent = min(count, MAX_TICKETS)
    for _ in range(sent):
        app.send_task(RENDER_TASK)
        if on_sent is not None:
            on_sent()
    return sent
