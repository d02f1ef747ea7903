"""A run's webhook notifications (one per finish) with every attempt. What `reelbatch notifications` shows."""

from __future__ import annotations

from jobs.notify.outbox import NotificationInfo
from jobs.notify.outbox import notifications as outbox_notifications
from jobs.settings import Settings
from jobs.usecases.database import read_factory


def notifications(settings: Settings, run: str) -> list[NotificationInfo]:
    return outbox_notifications(read_factory(settings), run)
