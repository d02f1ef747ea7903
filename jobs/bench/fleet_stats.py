"""What the servers say about a level of `reelbatch bench fleet` (jobs.bench.fleet): PostgreSQL's own active time
and transactions (committed or rolled back) in the level's database, its statements by total time
(pg_stat_statements, where the server loads it), its backends' CPU seconds (from /proc, where the server runs on
this machine), and Redis's CPU.

Apart from the level runner because each reads a server's own counters, not the rows the simulated workers wrote.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool


def backend_cpu(factory, seen: dict[int, float]) -> None:
    """The CPU seconds of each server process serving the level's database, last read from /proc: the connections
    are pooled for the whole level, so their last readings add up to nearly all the server's work for it. Nothing
    is read when the server is on another machine."""
    with factory() as s:
        pids = list(s.scalars(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND pid <> pg_backend_pid()")))
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # another machine's process, or gone
        seen[pid] = (int(fields[11]) + int(fields[12])) / ticks  # utime and stime, fields 14 and 15 of stat


def pg_stats(url: str) -> tuple[float, int]:
    """PostgreSQL's own account of the level's database: active milliseconds and transactions, committed or rolled
    back (a read that ends in ROLLBACK is a transaction as much as a write that commits; a probe in autocommit,
    jobs.db.connect.reads, commits)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT active_time, xact_commit + xact_rollback FROM pg_stat_database "
                                    "WHERE datname = current_database()")).one()
    finally:
        engine.dispose()
    return float(row[0] or 0.0), int(row[1] or 0)


def track_statements(url: str) -> bool:
    """pg_stat_statements in the level's database, if the server preloads it (a superuser can create it)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            conn.execute(text("SELECT count(*) FROM pg_stat_statements"))
        return True
    except SQLAlchemyError:
        return False
    finally:
        engine.dispose()


def server_statements(url: str, top: int = 8) -> list[dict]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT calls, total_exec_time, query FROM pg_stat_statements WHERE dbid = "
                "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                "ORDER BY total_exec_time DESC LIMIT :top"), {"top": top}).all()
    finally:
        engine.dispose()
    return [{"calls": calls, "total_ms": ms, "mean_ms": ms / calls if calls else 0.0, "query": shown(query)}
            for calls, ms, query in rows]


def shown(query: str) -> str:
    """A statement short enough to read: its verb and table, and what follows FROM (or WHERE)."""
    words = " ".join(query.split())
    cut = max(words.find(" FROM "), 0) if words.startswith("SELECT") else max(words.find(" WHERE "), 0)
    return words[:40] + (" ..." + words[cut:cut + 200] if cut > 40 else words[40:240])


def redis_cpu(url: str) -> float:
    import redis  # here, not at the top: only the bench reads Redis's own counters

    server = redis.Redis.from_url(url)
    try:
        info = server.info("cpu")
    finally:
        server.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
