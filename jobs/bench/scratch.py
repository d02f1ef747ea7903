"""Scratch space for the control-plane benches (`reelbatch bench fleet` and `bench scale`): a throwaway database on the
operator's PostgreSQL server and a throwaway queue name on their Redis, so a bench never writes into real runs.

The database is created from the connection REELBATCH_DATABASE_URL names (its role needs CREATEDB), migrated to head,
and dropped afterwards (WITH (FORCE): connections a failed bench left open are ended). Redis keys under the queue name
are deleted afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from jobs.db.connect import upgrade
from jobs.errors import UsageError
from jobs.settings import Settings


def require_services(settings: Settings, what: str) -> None:
    """The benches measure the production control plane: PostgreSQL and Redis, nothing embedded."""
    if make_url(settings.database_url).get_backend_name() != "postgresql":
        raise UsageError(f"{what} measures PostgreSQL: set REELBATCH_DATABASE_URL to a PostgreSQL server "
                         f"(postgresql+psycopg://...), got {settings.database_url!r}")
    if not settings.broker_url.startswith(("redis://", "rediss://")):
        raise UsageError(f"{what} measures Redis tickets: set REELBATCH_BROKER_URL to a Redis server "
                         f"(redis://HOST:6379/0), got {settings.broker_url!r}")


@contextmanager
def scratch_database(url: str, prefix: str) -> Iterator[str]:
    """The URL of a fresh, migrated database on `url`'s server, dropped when the block ends."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:
        raise UsageError(f"the bench makes a scratch database on REELBATCH_DATABASE_URL's server and could not: "
                         f"{exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None
    scratch = make_url(url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(scratch)
        yield scratch
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def scratch_queue(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def drop_queues(broker_url: str, queue: str) -> None:
    """Delete the Redis keys of `queue` and the queues under it (`QUEUE.model.M`, `QUEUE.control`)."""
    import redis  # here, not at the top: only the benches talk to Redis directly

    server = redis.Redis.from_url(broker_url)
    try:
        keys = list(server.scan_iter(match=f"{queue}*", count=1000))
        if keys:
            server.delete(*keys)
    finally:
        server.close()
