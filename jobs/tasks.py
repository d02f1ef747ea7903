"""Thin Celery tasks: take a ticket, call one plain function, let the database record the result."""

from __future__ import annotations

from functools import lru_cache

from celery import shared_task

from engine.engine import Engine
from jobs.db import session_factory
from jobs.render import render_next_batch
from jobs.settings import Settings


@lru_cache(maxsize=1)
def _worker_state() -> tuple[Settings, Engine]:
    """Settings and the engine, made once per worker process: the pipeline loads once and stays."""
    settings = Settings.from_env()
    return settings, Engine(settings.engine_config(), settings.registry())


@shared_task(name="reelbatch.render_next", acks_late=True)
def render_next() -> dict:
    settings, engine = _worker_state()
    result = render_next_batch(settings, engine, session_factory(settings.database_url))
    return {"claimed": result.claimed, "succeeded": result.succeeded, "failed": result.failed}


def send_tickets(count: int) -> None:
    """One ticket per pending unit; extra tickets find nothing to claim and return at once."""
    for _ in range(count):
        render_next.apply_async()
