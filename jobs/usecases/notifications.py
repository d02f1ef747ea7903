"""A run's webhook notifications (one per finish) with every attempt. What `reelbatch notifications` shows."""

from __future__ import annotations

from jobs.db.connect import session_factory
from jobs.notify.outbox import NotificationInfo, notifications as outbox_notifications
from jobs.settings import Settings


def notifications(settings: Settings, run: str) -> list[NotificationInfo]:
    return outbox_notifications(session_factory(settings.database_url), run)
