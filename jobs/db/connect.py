"""Database connections and schema upgrades.

SQLite (the embedded default): WAL so readers never block the writer, a busy timeout, foreign keys on, and every
transaction begun IMMEDIATE so a claim takes the write lock up front (a deferred transaction that upgrades to a write
can fail with SQLITE_BUSY despite the timeout), but a reader's (`snapshots`, `reads`): it begins DEFERRED, a snapshot
that never waits for a writer. PostgreSQL: plain pooled connections; claims use SKIP LOCKED.
"""

from __future__ import annotations

import ast
import re
import time
import weakref
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from sqlalchemy import create_engine, event, exc, inspect, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from jobs.errors import SchemaOutOfDate

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
IDLE_IN_TRANSACTION_MS = 30_000
# A pooled connection idle this long is pinged before use (ping_when_idle); one back sooner has just worked.
PING_IDLE_S = 1.0


def is_postgres(url: str) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


def make_engine(url: str, pool_size: int | None = None) -> Engine:
    """An engine for `url`. `pool_size` (PostgreSQL): connections kept per process, none beyond it (a process
    that runs many simulated workers, `reelbatch bench fleet`); default SQLAlchemy's 5, plus 10 on demand."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        pool = {} if pool_size is None else {"pool_size": pool_size, "max_overflow": 0, "pool_timeout": 120}
        # Our transactions last milliseconds. A worker frozen (SIGSTOP, a swap storm, a VM pause) inside one would
        # hold its row locks for ever, and SKIP LOCKED would hide its expired lease from every reaper: the server
        # ends such a session after this long, releasing the locks. JIT off: our statements are index lookups and
        # a report's per-video sums, where compiling never pays (a 100,000-video report's query spent 0.72 of its
        # 1.13 s compiling; docs/SCALE.md).
        return ping_when_idle(create_engine(url, connect_args={
            "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} -c jit=off",
            "cursor_factory": _unpipelined_cursor()}, **pool), PING_IDLE_S)
    if parsed.get_backend_name() != "sqlite":
        return ping_when_idle(create_engine(url), PING_IDLE_S)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # let the "begin" hook below issue BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(SNAPSHOT) else "BEGIN IMMEDIATE")

    return engine


def ping_when_idle(engine: Engine, idle_s: float) -> Engine:
    """Ping a pooled connection before use if it sat idle `idle_s` or longer, as SQLAlchemy's `pool_pre_ping` pings
    every one: a connection the server dropped (a restart, a failover, an idle timeout) is replaced, and the whole
    pool with it, before a statement meets it. A connection back within `idle_s` has just worked; pinging it too was
    half of each short statement's client CPU and one more server transaction per checkout, which a busy process
    (`reelbatch bench fleet`'s simulated workers) paid thousands of times a second (docs/SCALE.md). A statement
    that meets a restart anyway fails as one would between a ping and its statement: SQLAlchemy invalidates the pool
    and the caller's retry gets fresh connections."""
    used = "reelbatch_used_at"

    @event.listens_for(engine, "connect")
    def _connected(_dbapi_conn, record):
        record.info[used] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn, record):
        record.info[used] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, record, _proxy):
        idle = time.monotonic() - record.info.get(used, float("-inf"))
        if idle < idle_s:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as err:  # noqa: BLE001 - whatever the reason, the connection is not usable
            raise exc.InvalidatePoolError(f"ping of a pooled connection idle {idle:.1f} s failed: {err}") from err

    return engine


def _unpipelined_cursor():
    """A psycopg cursor whose executemany sends one statement at a time, each ending in a Sync.

    psycopg runs executemany in pipeline mode: Bind/Execute for each row, one Sync at the end. A client frozen between
    those (the ORM flushes a claimed batch's rows with executemany) leaves its server session "active", reading from
    the client, not "idle in transaction", so the timeout above never ends it and its row locks stay for ever
    (tests/jobs/test_connect.py shows it). Statement by statement, every pause inside a transaction is idle.
    """
    import psycopg

    class UnpipelinedCursor(psycopg.Cursor):
        def executemany(self, query, params_seq, *, returning: bool = False) -> None:
            with self._conn.lock:
                self._conn.wait(self._executemany_gen_no_pipeline(query, params_seq, returning))

    return UnpipelinedCursor


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def current_and_head(engine: Engine) -> tuple[str | None, str]:
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(engine.url.render_as_string(False))).get_current_head()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


# A migration's `revision = '0009'` and `down_revision = '0008'` lines (a tuple where branches merge).
_REVISION_LINE = re.compile(r"^(down_revision|revision)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


@lru_cache(maxsize=4)
def script_head(folder: Path = MIGRATIONS / "versions") -> str | None:
    """The head revision of the migrations in `folder`, read from each file's `revision` and `down_revision` lines;
    None where that is not plain (a line it cannot read, not exactly one head): then alembic decides.

    Only for the check every command makes (`session_factory`): alembic's ScriptDirectory imports alembic and runs
    every migration file to find the head, 0.15-0.19 s of CPU at each command's start (docs/PERFORMANCE.md);
    tests/jobs/test_cli_startup.py checks that both find the same head."""
    revisions: set[str] = set()
    below: set[str] = set()
    for path in sorted(folder.glob("*.py")):
        found = dict(m.groups() for m in _REVISION_LINE.finditer(path.read_text(encoding="utf-8")))
        if path.name == "__init__.py" and not found:
            continue
        try:
            revision, down = ast.literal_eval(found["revision"]), ast.literal_eval(found["down_revision"])
        except (KeyError, ValueError, SyntaxError):
            return None
        if not isinstance(revision, str):
            return None
        revisions.add(revision)
        below.update([] if down is None else [down] if isinstance(down, str) else list(down))
    heads = revisions - below
    return heads.pop() if len(heads) == 1 else None


def _schema_is_current(engine: Engine) -> bool:
    """True when the database's one alembic revision is the scripts' one head, read without alembic; False when
    that cannot be said so simply (the caller asks alembic)."""
    head = script_head()
    if head is None:
        return False
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return False
        versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return versions == [head]


@lru_cache(maxsize=8)
def session_factory(url: str) -> sessionmaker[Session]:
    """Sessions for `url`, with the schema checked once per process.

    The SQLite default upgrades itself on first use (zero setup); other databases must be upgraded by the operator
    with `reelbatch db upgrade`, so a worker never changes a shared schema behind the operator's back.
    """
    engine = make_engine(url)
    if _schema_is_current(engine):  # the usual case, without importing alembic
        return sessionmaker(engine, expire_on_commit=False)
    current, head = current_and_head(engine)
    if current != head:
        if engine.url.get_backend_name() == "sqlite":
            upgrade(url)
        else:
            raise SchemaOutOfDate(
                f"database schema is at {current or 'nothing'}, code expects {head}: run `reelbatch db upgrade`"
            )
    return sessionmaker(engine, expire_on_commit=False)


# An execution option: a SQLite transaction of a connection that carries it begins DEFERRED (`snapshots`).
SNAPSHOT = "reelbatch_snapshot"
_SNAPSHOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_READS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def snapshots(factory: sessionmaker[Session]) -> sessionmaker[Session]:
    """Sessions for work that only reads (a status, a report, a token's team, the service's read of the queue).

    SQLite: each transaction begins DEFERRED, in WAL a snapshot that never waits for the write lock, which every
    other transaction takes up front (BEGIN IMMEDIATE) and a 100,000-video submit holds for seconds: another team's
    status waited for it (docs/SERVICE.md). A session from here that writes may fail with SQLITE_BUSY rather than
    wait. PostgreSQL: `factory` itself (its readers never wait for writers)."""
    found = _SNAPSHOTS.get(factory)
    if found is None:
        engine = factory.kw["bind"]
        found = factory
        if engine.url.get_backend_name() == "sqlite":
            found = sessionmaker(engine.execution_options(**{SNAPSHOT: True}), **{
                k: v for k, v in factory.kw.items() if k != "bind"})
        _SNAPSHOTS[factory] = found
    return found


def reads(factory: sessionmaker[Session]) -> Callable[[], Connection]:
    """Connections for a single read-only statement of columns, a probe the fleet sends many of (a rendering batch's
    cancel check, a finished run's probe, a sweeper tick's): `with reads(factory)() as c: c.scalar(...)`.

    A Core connection, not an ORM session: the session's own machinery was about 0.45 ms of the client's CPU per
    probe, more than the statement's. On PostgreSQL in autocommit: the statement alone, without the BEGIN before it
    and the ROLLBACK after it, two round trips where there were four (the pool's pre-ping is the other). One
    statement sees one snapshot either way (docs/PERFORMANCE.md, "Probes alone"). SQLite: a DEFERRED transaction,
    as `snapshots`, so a probe never waits for a writer's lock."""
    found = _READS.get(factory)
    if found is None:
        engine = factory.kw["bind"]
        if engine.url.get_backend_name() == "postgresql":
            engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        elif engine.url.get_backend_name() == "sqlite":
            engine = engine.execution_options(**{SNAPSHOT: True})
        found = _READS[factory] = engine.connect
    return found
