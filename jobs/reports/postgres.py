"""A run's report made by PostgreSQL (`REELBATCH_REPORT_SQL`, on by default): its figures counted and summed by the
server, and `--json`'s per-video entries written by the server as JSON text, which the client only passes on.

Bringing a 100,000-video run's rows into Python took most of a report's 10 s, and building and encoding 100,000
entries most of the rest (docs/SCALE.md). Here only the two columns whose percentiles are reported (queue wait and
render latency, one float each per video) come to Python, where jobs.reports.stats computes the percentiles exactly
as for SQLite (numpy's interpolation, which PostgreSQL's percentile_cont does not promise to match to the bit).

What must match jobs.reports.figures and jobs.reports.summary.entry exactly, and how:
- float sums: `sum(x ORDER BY id)` adds left to right in id order, as jobs.reports.stats.ordered_sum does;
- seconds between two moments: PostgreSQL's interval is exact to the microsecond, so its epoch (an exact numeric)
  rounds to the same float as Python's timedelta.total_seconds();
- JSON text: strings by to_json (it escapes what Python's json module escapes with ensure_ascii=False: the quote,
  the backslash, and control characters, as \\b \\f \\n \\r \\t or \\u00xx), numbers as Python's repr writes them
  (_float below), keys in the entry's order with Python's ", " and ": " separators.
tests/jobs/test_report_postgres.py compares both paths' output byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session, sessionmaker

from jobs.cost.ledger import Charges
from jobs.db.queries import report_attempts
from jobs.db.rows import CostRecord, Run, Video
from jobs.db.status import Status
from jobs.reports.figures import STAGES, Figures, failure_reason

# Rows fetched at a time from the server-side cursor of entries (about 500 bytes each).
CHUNK = 2000


def _float(column: str) -> str:
    """A double as Python's repr writes it: PostgreSQL (extra_float_digits 1, its default since 12) writes the same
    shortest digits, but an integral value without ".0" (5 for 5.0), and from 1e15 up in exponent form where Python
    keeps the digits up to 1e16 (1.0000000000000002e+15 for 1000000000000000.2). NaN and Infinity are written alike.
    Under 1e15, the common case, comes first: a non-integral value there is PostgreSQL's own text, and the regexp,
    which only rewrites a "e+15", runs only from 1e15 up (running it on every non-integral value was half the CPU
    of writing the doubles: docs/PERFORMANCE.md)."""
    return (f"CASE WHEN {column} IS NULL THEN 'null' "
            f"WHEN abs({column}) < 1e15 THEN CASE WHEN {column} = trunc({column}) THEN {column}::text || '.0' "
            f"ELSE {column}::text END "
            f"WHEN abs({column}) < 1e16 THEN CASE WHEN {column} = trunc({column}) THEN {column}::bigint::text || '.0' "
            rf"ELSE regexp_replace({column}::text, '^(-?\d)\.(\d{{15}})(\d+)e\+15$', '\1\2.\3') END "
            f"ELSE {column}::text END")


def _text(column: str) -> str:
    return f"coalesce(to_json({column})::text, 'null')"


def _int(column: str) -> str:
    return f"coalesce({column}::text, 'null')"


def _bool(column: str) -> str:
    return f"CASE WHEN {column} THEN 'true' WHEN NOT {column} THEN 'false' ELSE 'null' END"


# jobs.reports.summary.entry's keys, in its order, with the column each is read from.
ENTRY = (
    ("id", _text("v.key")), ("status", _text("v.status")), ("uri", _text("v.uri")),
    ("poster_uri", _text("v.poster_uri")), ("prompt", _text("v.prompt")), ("seed", _int("v.seed")),
    ("frames", _int("v.frames")), ("fps", _int("v.fps")), ("duration_s", _float("v.duration_s")),
    ("width", _int("v.width")), ("height", _int("v.height")), ("steps", _int("v.steps")),
    ("guidance", _float("v.guidance")), ("bytes", _int("v.bytes")), ("sha256", _text("v.sha256")),
    ("attempts", _int("u.attempts")), ("error", _text("v.last_error")), ("render_s", _float("v.render_s")),
    ("encode_s", _float("v.encode_s")), ("upload_s", _float("v.upload_s")), ("chunks", _int("v.chunks")),
    ("seam_score", _float("v.seam_score")), ("needs_review", _bool("v.needs_review")),
    ("cancel_reason", _text("v.cancel_reason")), ("image", _text("v.image_uri")),
    ("image_sha256", _text("v.image_sha256")), ("fit", _text("v.image_fit")), ("flagged", _bool("v.flagged")),
    # Stored as JSON text that Python's json module writes back unchanged (jobs.render.checks.checks_json).
    ("checks", "coalesce(v.checks, 'null')"), ("cost_usd", _float("c.cost_usd")),
)
# One format() per entry, its template the entry's keys and separators (%% is psycopg's escape of format's %): the
# text is built once, where a chain of 56 `||` copied the growing entry at each step (0.1-0.3 s of the server's CPU
# for 100,000 entries; docs/PERFORMANCE.md).
_TEMPLATE = "{" + ", ".join(f'"{key}": %%s' for key, _ in ENTRY) + "}"
_ENTRIES = (f"SELECT format('{_TEMPLATE}', " + ", ".join(value for _, value in ENTRY) + ")"
            # The run's rows sorted by id before the entries are made (sorting the made entries spilled 59 MB to
            # disk for 100,000 videos, the rows 23 MB; the time was the same within noise); the outer ORDER BY is
            # then met by the subquery's order, with no second sort.
            + " FROM (SELECT * FROM videos WHERE run_id = %(run)s ORDER BY id) v CROSS JOIN LATERAL ("
            # Each video's cost summed from its own records through their index, once per video (in the select
            # list, every mention of it in _float would sum it again).
            "SELECT coalesce(sum(amount_micro_usd), 0)::float8 / 1e6::float8 AS cost_usd FROM cost_records "
            "WHERE video_id = v.id) c CROSS JOIN LATERAL ("
            # Its attempts as jobs.db.queries.report_attempts counts them (one, plus each retry of any chunk).
            "SELECT coalesce(sum(attempts) - count(*) + 1, 0) AS attempts FROM work_units "
            "WHERE video_id = v.id AND attempts > 0) u ORDER BY v.id")


def charges(s: Session, run: Run) -> Charges:
    """The run's cost records by kind, and their sessions (jobs.cost.ledger.run_charges), read through each video's
    index: the plain join read the whole cost table (a hash join over 2,200,000 records for a run's 200,000; the
    OFFSET keeps PostgreSQL from turning the per-video lookup back into that join). Summed by (kind, session) in a
    hash, then by kind here: `array_agg(DISTINCT ...)` made the server sort all 200,000 records by kind first."""
    rows = s.execute(text(
        "SELECT c.kind, c.session_id, sum(c.amount_micro_usd), sum(c.seconds) "
        "FROM videos v CROSS JOIN LATERAL (SELECT kind, amount_micro_usd, seconds, session_id FROM cost_records "
        "WHERE video_id = v.id OFFSET 0) c WHERE v.run_id = :run GROUP BY c.kind, c.session_id"), {"run": run.id}).all()
    kinds: dict[str, tuple[int, float]] = {}
    for kind, _, micro, secs in rows:
        total_micro, total_s = kinds.get(kind, (0, 0.0))
        kinds[kind] = (total_micro + int(micro or 0), total_s + float(secs or 0.0))
    return Charges([(kind, *kinds[kind]) for kind in sorted(kinds)],
                   sorted({session for _, session, *_ in rows if session is not None}))


def figures(s: Session, run: Run, total_micro: int) -> Figures:
    """The run's figures, as jobs.reports.figures.figures would count them from its rows. `total_micro`: its charges
    (the sum of `charges`' kinds)."""
    s.execute(text("SET LOCAL extra_float_digits = 1"))  # shortest exact digits, whatever the server's setting
    params = {"run": run.id, "ok": Status.SUCCEEDED.value}
    counts = {st.value: 0 for st in Status}
    for status, n in s.execute(text("SELECT status, count(*) FROM videos WHERE run_id = :run GROUP BY status"),
                               params):
        counts[Status(status).value] = n
    stage_sums = ", ".join(f"sum({stage}_s ORDER BY id)" for stage in STAGES)
    ok, seconds, last_finish, *stages, latencies = s.execute(text(
        f"SELECT count(*), sum(duration_s ORDER BY id), max(finished_at), {stage_sums}, "
        "array_agg(extract(epoch FROM finished_at - started_at)::float8) "
        "FROM videos WHERE run_id = :run AND status = :ok"), params).one()
    first_start, waits = s.execute(text(
        "SELECT min(v.started_at), array_agg(extract(epoch FROM v.started_at - r.created_at)::float8) "
        "FROM videos v JOIN runs r ON r.id = v.run_id WHERE v.run_id = :run AND v.started_at IS NOT NULL"),
        params).one()
    failures: dict[str, int] = {}
    for error, n in s.execute(text(  # reasons in the order of each one's first video, as Python counts them
            "SELECT last_error, count(*) FROM videos WHERE run_id = :run AND status = :failed "
            "GROUP BY last_error ORDER BY min(id)"), params | {"failed": Status.FAILED.value}):
        reason = failure_reason(error)
        failures[reason] = failures.get(reason, 0) + n
    flagged = s.execute(text("SELECT count(*) FROM videos WHERE run_id = :run AND flagged"), params).scalar_one()
    reasons = dict(s.execute(text(
        "SELECT cancel_reason, count(*) FROM videos WHERE run_id = :run AND status = :cancelled "
        "AND cancel_reason <> '' GROUP BY cancel_reason"), params | {"cancelled": Status.CANCELLED.value}).all())
    return Figures(
        counts=counts, succeeded=ok, total_micro=total_micro,
        video_seconds=seconds if ok else 0, first_start=first_start, last_finish=last_finish, failures=failures,
        queue_waits=waits or [], latencies=latencies or [],
        stages_s={stage: (0 if not ok else value if value is not None else 0.0) for stage, value in zip(STAGES, stages)},
        cancelled_by_reason={reason: reasons[reason] for reason in sorted(reasons)},
        flagged=flagged,
    )


def listed_rows(s: Session, run: Run, listed: int) -> list[tuple[Video, int]]:
    """The rows the text report lists: the first `listed` videos and every one with an error or flagged, each with its
    cost (as jobs.db.queries.load_report gives them)."""
    cost = (select(func.coalesce(func.sum(CostRecord.amount_micro_usd), 0))
            .where(CostRecord.video_id == Video.id).scalar_subquery())
    first = select(Video.id).where(Video.run_id == run.id).order_by(Video.id).limit(listed)
    columns = [c for c in Video.__table__.columns if c.name != "attempts"]
    rows = s.execute(select(*columns, report_attempts().label("attempts"), cost.label("cost_micro_usd"))
                     .where(Video.run_id == run.id, or_(Video.id.in_(first), Video.last_error != "", Video.flagged))
                     .order_by(Video.id)).all()
    return [(v, int(v.cost_micro_usd)) for v in rows]


def entries(s: Session, run: Run) -> Iterator[str]:
    """Every video's entry as JSON text, in id order, a chunk at a time: the entries of a chunk joined by ", "."""
    s.execute(text("SET LOCAL extra_float_digits = 1"))
    driver = s.connection().connection.driver_connection  # psycopg's own: a server-side cursor, rows as they come
    with driver.cursor(name="report_entries") as cursor:
        cursor.execute(_ENTRIES, {"run": run.id})
        while rows := cursor.fetchmany(CHUNK):
            yield ", ".join(row[0] for row in rows)


@contextmanager
def entries_beside(factory: sessionmaker[Session], s: Session, run: Run) -> Iterator[Future[list[str]]]:
    """`entries` of `run`, read to the end by a thread on a second connection in `s`'s snapshot (`s` must be in a
    REPEATABLE READ transaction), while `s` goes on counting the charges and figures: the server works on both at
    once (`REELBATCH_REPORT_PARALLEL`; for 100,000 videos the entries take 0.7-0.9 s of wall and the rest 0.5 s,
    docs/PERFORMANCE.md). Yields the future of the chunks; one snapshot, so the figures and the entries agree."""
    snapshot = s.execute(text("SELECT pg_export_snapshot()")).scalar_one()
    if not re.fullmatch(r"[0-9A-Fa-f-]+", snapshot):  # written into the statement: SET TRANSACTION takes no parameter
        raise ValueError(f"unexpected snapshot id {snapshot!r}")
    with factory() as other, ThreadPoolExecutor(1, thread_name_prefix="report-entries") as pool:
        other.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        other.execute(text(f"SET TRANSACTION SNAPSHOT '{snapshot}'"))  # before any other statement of its transaction
        yield pool.submit(lambda: list(entries(other, run)))
