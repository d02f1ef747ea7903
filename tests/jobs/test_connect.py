"""Connections (jobs.db.connect) against SQLite and a real PostgreSQL: the schema check, the server ending a session
stuck inside a transaction, and pinging only connections that sat idle."""

import threading
import time

import pytest
from sqlalchemy import create_engine, exc, inspect, text
from sqlalchemy.pool import NullPool

from jobs.db.connect import current_and_head, make_engine, session_factory
from jobs.errors import SchemaOutOfDate


def test_sqlite_default_upgrades_itself_on_first_use(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    session_factory(url)
    engine = make_engine(url)
    current, head = current_and_head(engine)
    assert current == head
    assert {"runs", "videos", "work_units", "cost_records"} <= set(inspect(engine).get_table_names())


def test_postgres_must_be_upgraded_by_the_operator(postgres_url):
    with pytest.raises(SchemaOutOfDate, match="reelbatch db upgrade"):
        session_factory(postgres_url)


def _dropped_by_the_server(url: str, engine) -> int:
    """The pooled connection's backend pid, after the server has ended that backend (as a restart ends them all)."""
    with engine.connect() as conn:
        pid = conn.scalar(text("SELECT pg_backend_pid()"))
    other = create_engine(url, poolclass=NullPool)
    with other.connect() as conn:
        assert conn.scalar(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
    other.dispose()
    return pid


def test_a_connection_idle_past_the_ping_window_is_replaced_before_use(postgres_url, monkeypatch):
    monkeypatch.setattr("jobs.db.connect.PING_IDLE_S", 0.0)  # every checkout has been idle long enough
    engine = make_engine(postgres_url, pool_size=1)
    pid = _dropped_by_the_server(postgres_url, engine)
    with engine.connect() as conn:  # the ping failed on checkout, and the pool connected afresh
        assert conn.scalar(text("SELECT pg_backend_pid()")) != pid


def test_a_connection_back_within_the_ping_window_is_not_pinged(postgres_url, monkeypatch):
    """So a dropped one meets the statement: it fails as a disconnect, the pool is invalidated, and the next
    checkout connects afresh (what the caller's retry gets)."""
    monkeypatch.setattr("jobs.db.connect.PING_IDLE_S", 3600.0)
    engine = make_engine(postgres_url, pool_size=1)
    pid = _dropped_by_the_server(postgres_url, engine)
    with pytest.raises(exc.OperationalError) as failed, engine.connect() as conn:
        conn.scalar(text("SELECT 1"))
    assert failed.value.connection_invalidated
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT pg_backend_pid()")) != pid


def test_a_client_paused_inside_executemany_cannot_hold_row_locks(postgres_url, monkeypatch):
    """A worker frozen halfway through an ORM flush (executemany) must not keep its row locks past the server's
    idle-in-transaction timeout. psycopg's default executemany pipelines its statements under one Sync, and a client
    paused between them leaves the session "active": no timeout ends it and SKIP LOCKED hides the rows for ever (the
    cause of a CI failure in tests/e2e/test_faults.py)."""
    monkeypatch.setattr("jobs.db.connect.IDLE_IN_TRANSACTION_MS", 1000)
    engine = make_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (id int PRIMARY KEY, v int)"))
        conn.execute(text("INSERT INTO t SELECT g, 0 FROM generate_series(1, 4) g"))
    resume = threading.Event()

    def rows():  # the client pauses after its first statement, holding every row it locked
        yield {"id": 1}
        resume.wait(30)
        yield {"id": 2}

    errors = []

    def frozen_client():
        raw = engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("SELECT id FROM t WHERE id IN (1, 2) FOR UPDATE")
            cur.executemany("UPDATE t SET v = v + 1 WHERE id = %(id)s", rows())
            raw.commit()
        except Exception as exc:  # noqa: BLE001 - the server ending the session is the expected outcome
            errors.append(exc)
        finally:
            raw.invalidate() if errors else raw.close()

    client = threading.Thread(target=frozen_client)
    client.start()
    try:
        other = make_engine(postgres_url)
        deadline = time.monotonic() + 15
        free: list[int] = []
        while time.monotonic() < deadline and free != [1, 2, 3, 4]:
            time.sleep(0.25)
            with other.begin() as conn:
                free = list(conn.scalars(text("SELECT id FROM t ORDER BY id FOR UPDATE SKIP LOCKED")))
        assert free == [1, 2, 3, 4], f"rows still locked by the paused client after 15 s; free: {free}"
    finally:
        resume.set()
        client.join(30)
    assert errors, "the paused client's transaction should have been ended by the server"
    with other.connect() as conn:
        assert list(conn.execute(text("SELECT v FROM t ORDER BY id"))) == [(0,), (0,), (0,), (0,)]
    other.dispose(), engine.dispose()
