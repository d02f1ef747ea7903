"""Manifests rendered on a cron schedule: add, list and remove a schedule (a worker fires them: jobs.work.firing).
What `reelbatch schedule` does."""

from __future__ import annotations

from jobs.db.connect import session_factory
from jobs.settings import Settings
from jobs.work import schedules
from jobs.work.schedules import ScheduleInfo


def add_schedule(settings: Settings, name: str, manifest: str, cron: str, notify: str | None = None) -> ScheduleInfo:
    """At each cron time (UTC) a worker submits the manifest as run NAME-YYYYmmddTHHMMSSZ."""
    return schedules.add_schedule(session_factory(settings.database_url), name, manifest, cron, notify=notify,
                                  settings=settings)


def list_schedules(settings: Settings) -> list[ScheduleInfo]:
    return schedules.list_schedules(session_factory(settings.database_url))


def remove_schedule(settings: Settings, name: str) -> None:
    """The schedule and its firing history removed; the runs it made stay."""
    schedules.remove_schedule(session_factory(settings.database_url), name)


def check_database(settings: Settings) -> None:
    """Refuse to start a beat against a schema this code does not know."""
    session_factory(settings.database_url)
