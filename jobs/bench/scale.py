"""`reelbatch bench scale`: the control plane's commands and the claim when the tables are large.

In a scratch database (jobs.bench.scratch), measured with the real code paths:

1. `reelbatch submit` of a `videos`-line JSONL, as a user runs it (a fresh process: start-up, validation, the
   rows, the tickets on Redis);
2. the claim's latency (jobs.claims.claims.claim_batch, batches of 4) with only that run's units pending;
3. the same with `finished` finished videos, units and cost records added (bulk inserts: an older run, done), and the
   claim probe's query plan;
4. `reelbatch status`, `reelbatch report RUN` and `reelbatch report RUN --json` once the run itself is done (its rows
   finished in bulk, with the two cost records a stored video has), each a fresh process as a user runs it, `repeat`
   times in turn; the reports both ways, made by PostgreSQL (`REELBATCH_REPORT_SQL=1`, the default) and in Python
   over every row (`=0`), so one run of the bench compares them under the same load.

The bulk rows are made with INSERT ... SELECT generate_series, then ANALYZE (a production database's autovacuum
keeps statistics; a freshly filled table has none).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import create_engine, select, text
from sqlalchemy.pool import NullPool

from jobs.bench.scratch import drop_queues, require_services, scratch_database, scratch_queue
from jobs.claims import claims
from jobs.claims.claims import ORDER, Serving
from jobs.cost import ledger
from jobs.db import queries
from jobs.db.base import utcnow
from jobs.db.connect import session_factory
from jobs.db.queries import claimable_units
from jobs.db.rows import WorkUnit
from jobs.errors import ReelbatchError
from jobs.reports import postgres
from jobs.reports.stats import percentiles
from jobs.reports.summary import report_dict, report_of
from jobs.settings import Settings

VIDEOS = 100_000
FINISHED = 1_000_000
CLAIMS = 300
RUN = "scale"
SHAPE = "tiny|64x64|f9|s4|g5"  # the tiny model's defaults: what the submitted run's videos are


@dataclass
class ScaleResult:
    videos: int
    finished: int
    # Each command as a user runs it: wall seconds of a fresh process, and the CPU seconds it used (less sensitive to
    # other work on the machine).
    submit_s: float
    submit_cpu_s: float
    claim_ms_pending_only: dict[str, float]
    claim_ms_with_finished: dict[str, float]
    claim_plan: list[str]
    # status and the reports: the fastest of `repeat` runs (wall, and CPU apart), every run in `runs`.
    status_s: float
    status_cpu_s: float
    report_s: float  # `report RUN --json`, made by PostgreSQL
    report_cpu_s: float
    report_text_s: float  # `report RUN`, made by PostgreSQL
    report_text_cpu_s: float
    report_python_s: float  # `report RUN --json` with REELBATCH_REPORT_SQL=0
    report_python_cpu_s: float
    report_text_python_s: float
    report_text_python_cpu_s: float
    runs: dict[str, list[tuple[float, float]]]  # each command's (wall, CPU) seconds, in the order run
    # The commands' own work in this process, without the interpreter's start: status's queries, and the JSON
    # report's queries, summary and JSON text (in Python over every row; by PostgreSQL).
    status_work_s: float
    report_work_s: float
    report_sql_work_s: float
    bulk_insert_s: float

    def to_dict(self) -> dict:
        return asdict(self)


# The commands timed once the run is done, by name: their arguments, and REELBATCH_REPORT_SQL.
COMMANDS = {"status": (("status",), "1"), "report_text": (("report", RUN), "1"),
            "report": (("report", RUN, "--json"), "1"), "report_text_python": (("report", RUN), "0"),
            "report_python": (("report", RUN, "--json"), "0")}


def run_scale(settings: Settings, *, videos: int = VIDEOS, finished: int = FINISHED, claim_count: int = CLAIMS,
              repeat: int = 2, on_step=None) -> ScaleResult:
    require_services(settings, "bench scale")
    step = on_step or (lambda _: None)
    claim_count = max(1, min(claim_count, videos // 10))  # two rounds of 4-unit claims, some units left for the plan
    queue = scratch_queue("scale")
    with tempfile.TemporaryDirectory(prefix="reelbatch-scale-") as tmp, \
            scratch_database(settings.database_url, "reelbatch_scale") as url:
        env = _env(settings, url, queue, Path(tmp))
        manifest = Path(tmp) / f"{RUN}.jsonl"
        manifest.write_text("".join(json.dumps({"id": f"v{i}", "prompt": f"scale video {i}"}) + "\n"
                                    for i in range(videos)))
        step(f"submit of {videos:,} videos")
        submit = _timed_cli(env, tmp, "submit", str(manifest), "--json")
        factory = session_factory(url)
        step(f"{claim_count} claims, {videos:,} pending")
        pending_only = _claim_latency(factory, claim_count)
        step(f"{finished:,} finished videos, in bulk")
        t0 = time.perf_counter()
        _bulk_finished(url, finished)
        bulk_s = time.perf_counter() - t0
        step(f"{claim_count} claims, {finished:,} finished in the tables")
        with_finished = _claim_latency(factory, claim_count)
        plan = _probe_plan(url)
        _finish_run(url)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
        for i in range(repeat):  # in turn, so that other work on the machine weighs on each alike
            step(f"status and reports of {videos:,} videos ({i + 1} of {repeat})")
            for name, (args, in_sql) in COMMANDS.items():
                runs[name].append(_timed_cli(env | {"REELBATCH_REPORT_SQL": in_sql}, tmp, *args))
        best = {name: (min(w for w, _ in times), min(c for _, c in times)) for name, times in runs.items()}
        status_work, report_work = _status_work(factory, settings), _report_work(factory, settings)
        report_sql_work = _report_sql_work(factory, settings)
        factory.kw["bind"].dispose()
        session_factory.cache_clear()
        drop_queues(settings.broker_url, queue)
    return ScaleResult(videos, finished, *submit, pending_only, with_finished, plan, *best["status"], *best["report"],
                       *best["report_text"], *best["report_python"], *best["report_text_python"], runs, status_work,
                       report_work, report_sql_work, bulk_s)


def _env(settings: Settings, url: str, queue: str, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")}
    env.update(REELBATCH_DATABASE_URL=url, REELBATCH_BROKER_URL=settings.broker_url, REELBATCH_QUEUE=queue,
               REELBATCH_OUTPUT=(tmp / "out").as_uri() + "/", REELBATCH_CACHE_DIR=str(settings.engine.cache_dir))
    # This checkout's code, as the command measuring it runs.
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    return env


def _timed_cli(env: dict, cwd, *args: str) -> tuple[float, float]:
    """Wall and CPU seconds of `reelbatch ARGS` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jobs", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=3600, stdin=subprocess.DEVNULL)
    spent = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise ReelbatchError(f"reelbatch {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return spent, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _status_work(factory, settings: Settings) -> float:
    t0 = time.perf_counter()
    queries.run_counts(factory)
    queries.unserved_pending(factory, 3 * settings.limits.lease_s)
    return time.perf_counter() - t0


def _report_work(factory, settings: Settings) -> float:
    t0 = time.perf_counter()
    run, videos = queries.load_report(factory, RUN)
    json.dumps(report_dict(run, videos, settings.prices.sale, ledger.run_ledger(factory, run.id)))
    return time.perf_counter() - t0


def _report_sql_work(factory, settings: Settings) -> float:
    t0 = time.perf_counter()
    run = queries.find_run(factory, RUN)
    with factory() as s:
        charges = postgres.charges(s, run)
        costs = ledger.run_ledger(factory, run.id, charges)
        figures = postgres.figures(s, run, sum(micro for _, micro, _ in charges.by_kind))
        json.dumps(report_of(run, figures, [], settings.prices.sale, costs))
        for _ in postgres.entries(s, run):
            pass
    return time.perf_counter() - t0


def _claim_latency(factory, count: int) -> dict[str, float]:
    serving = Serving(("tiny",))
    spent = []
    for _ in range(count):
        t0 = time.perf_counter()
        claim = claims.claim_batch(factory, owner="scale", max_batch=4, lease_s=3600, serving=serving)
        spent.append((time.perf_counter() - t0) * 1000)
        if claim is None:
            raise ReelbatchError("the scale bench ran out of claimable units")
    return percentiles(spent)


def _bulk_finished(url: str, count: int) -> None:
    """An older run of `count` finished videos: each succeeded, its unit succeeded, a gpu and a storage record."""
    now = utcnow()
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            run_id = conn.execute(text(
                "INSERT INTO runs (name, model, output, priority, source, content_sha256, created_at, updated_at) "
                "VALUES ('history', 'tiny', 'file:///history/', 0, 'bench', repeat('0', 64), :now, :now) "
                "RETURNING id"), {"now": now}).scalar_one()
            conn.execute(text(
                "INSERT INTO videos (run_id, key, line, prompt, seed, width, height, frames, fps, duration_s, steps, "
                "guidance, status, attempts, started_at, finished_at, render_s, uri, bytes, sha256, chunks, "
                "chunk_overlap, needs_review, created_at, updated_at) "
                "SELECT :run, 'h' || g, g, 'history ' || g, g, 64, 64, 9, 8, 1.0, 4, 5.0, 'succeeded', 1, :now, :now, "
                "1.0, 'file:///history/h' || g || '.mp4', 2000000, repeat('a', 64), 1, 0, false, :now, :now "
                "FROM generate_series(1, :n) g"), {"run": run_id, "now": now, "n": count})
            conn.execute(text(
                "INSERT INTO work_units (video_id, chunk, frames, ready, shape_key, model, priority, rank, status, "
                "attempts, solo, lease_token, created_at, updated_at) "
                "SELECT id, 0, 9, true, :shape, 'tiny', 0, 0, 'succeeded', 1, false, 1, :now, :now "
                "FROM videos WHERE run_id = :run"), {"run": run_id, "now": now, "shape": SHAPE})
            _costs(conn, run_id, now)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()


def _costs(conn, run_id: int, now) -> None:
    for kind, seconds, micro in (("gpu", 1.0, 1503), ("storage", 0.0, 43)):
        conn.execute(text(
            "INSERT INTO cost_records (video_id, kind, seconds, rate_usd_per_hour, rate_source, amount_micro_usd, "
            "created_at, updated_at) SELECT id, :kind, :seconds, 5.41, 'bench', :micro, :now, :now "
            "FROM videos WHERE run_id = :run"), {"kind": kind, "seconds": seconds, "micro": micro, "run": run_id,
                                                 "now": now})


def _finish_run(url: str) -> None:
    """The submitted run, done: every video succeeded with an object and its two cost records."""
    now = utcnow()
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            run_id = conn.execute(text("SELECT id FROM runs WHERE name = :name"), {"name": RUN}).scalar_one()
            conn.execute(text(
                "UPDATE videos SET status = 'succeeded', attempts = 1, started_at = :now, finished_at = :now, "
                "render_s = 1.0, uri = 'file:///scale/' || key || '.mp4', bytes = 2000000, sha256 = repeat('b', 64) "
                "WHERE run_id = :run"), {"run": run_id, "now": now})
            conn.execute(text(
                "UPDATE work_units SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL "
                "WHERE video_id IN (SELECT id FROM videos WHERE run_id = :run)"), {"run": run_id})
            _costs(conn, run_id, now)
    finally:
        engine.dispose()


def _probe_plan(url: str) -> list[str]:
    """EXPLAIN ANALYZE of the claim's probe for one model, with its values inlined as psycopg sends them."""
    probe = (select(WorkUnit.id).where(*claimable_units(utcnow()), WorkUnit.model == "tiny").order_by(*ORDER)
             .limit(1).with_for_update(skip_locked=True))
    engine = create_engine(url, poolclass=NullPool)
    try:
        sql = str(probe.compile(engine, compile_kwargs={"literal_binds": True}))
        with engine.begin() as conn:
            return [row[0] for row in conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"))]
    finally:
        engine.dispose()
