"""The report made by PostgreSQL (jobs.reports.postgres, `REELBATCH_REPORT_SQL=1`) says what the report made in
Python over every row says, to the byte: on a run of hand-chosen rows (the figures checked by hand) and on one of
awkward values (strings JSON must escape, floats whose text differs between the two, sums whose order matters)."""

import json
import math
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from jobs.cli import app
from jobs.db import queries
from jobs.db.connect import session_factory, upgrade
from jobs.db.rows import CostRecord, Run, Video, WorkerSession
from jobs.db.status import Status
from jobs.render.checks import checks_json, with_earlier
from jobs.reports import postgres
from jobs.reports.summary import entry, report_dict

T0 = datetime(2026, 11, 30, 2, 0, 0, 123456, tzinfo=timezone.utc)
HOSTILE = 'quote " backslash \\ newline \n tab \t bell \x07 esc \x1b del \x7f sep \u2028 bidi \u202e é 日本 🎬 [b]x[/b]'


@pytest.fixture
def pg(postgres_url):
    upgrade(postgres_url)
    return postgres_url


def _video(key, status, *, start=None, end=None, **fields):
    base = dict(key=key, status=status, line=1, prompt="p", seed=1, width=64, height=64, frames=81, fps=16,
                duration_s=5.0, steps=4, guidance=5.0, attempts=1, chunks=1, chunk_overlap=0, needs_review=False,
                started_at=None if start is None else T0 + timedelta(seconds=start),
                finished_at=None if end is None else T0 + timedelta(seconds=end))
    return Video(**(base | fields))


def _store(url, name, videos, costs, reverse=False, session=False, **run_fields):
    """A run of `videos` (ids 1, 2, ... in their order) with `costs`: {video key: [micro-dollars, ...]}. `reverse`:
    written last first, so the table holds them in the opposite order of their ids. `session`: the charges made by
    a worker session of 100 s at $36 an hour ($1), part of it idle."""
    factory = session_factory(url)
    with factory.begin() as s:
        worker = None
        if session:
            worker = WorkerSession(owner="h:1", up_s=100.0, rate_usd_per_hour=36.0, rate_source="t",
                                   ended_at=T0 + timedelta(hours=2), end_reason="stopped")
            s.add(worker)
            s.flush()
        run = Run(name=name, model="tiny", output="file:///o/", priority=0, source="m.jsonl", content_sha256="0" * 64,
                  created_at=T0, **run_fields)
        s.add(run)
        s.flush()
        for i, v in enumerate(videos):
            v.id = i + 1
        for v in reversed(videos) if reverse else videos:
            v.run_id = run.id
            s.add(v)
            s.flush()
            for micro in costs.get(v.key, []):
                s.add(CostRecord(video_id=v.id, kind="gpu", seconds=1.0, rate_usd_per_hour=5.41, rate_source="t",
                                 amount_micro_usd=micro, session_id=worker and worker.id))
    return factory


def _report(url, *args, sql: bool, parallel: bool = True):
    env = {"REELBATCH_DATABASE_URL": url, "REELBATCH_REPORT_SQL": "1" if sql else "0",
           "REELBATCH_REPORT_PARALLEL": "1" if parallel else "0", "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["report", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_figures_of_a_run_worked_by_hand(pg):
    """test_report.py's run, stored: claims at 10, 20, 30 and 50 s; two successes stored at 40 and 110 s."""
    rows = [
        _video("a", Status.SUCCEEDED, start=10, end=40, render_s=20.0, text_s=0.5, denoise_s=19.0, decode_s=0.5,
               encode_s=0.2, upload_s=0.1),
        _video("b", Status.SUCCEEDED, start=20, end=110, render_s=30.0, text_s=0.5, denoise_s=29.0, decode_s=0.5,
               encode_s=0.2, upload_s=0.1),
        _video("c", Status.FAILED, start=30, end=60, last_error="failed after 3 attempts: RenderError: blank"),
        _video("d", Status.FAILED, start=50, end=70, last_error="ObjectConflict: a different object"),
        _video("e", Status.PENDING),
    ]
    factory = _store(pg, "night", rows, {"a": [9_000, 1_000], "b": [20_000], "c": [6_000]})
    run = queries.find_run(factory, "night")
    with factory() as s:
        charges = postgres.charges(s, run)
        f = postgres.figures(s, run, 36_000)
    assert charges.by_kind == [("gpu", 36_000, 4.0)] and charges.sessions == []
    assert f.counts == {"pending": 1, "running": 0, "succeeded": 2, "failed": 2, "cancelled": 0}
    assert (f.succeeded, f.total_micro, f.video_seconds) == (2, 36_000, 10.0)
    assert (f.first_start, f.last_finish) == (T0 + timedelta(seconds=10), T0 + timedelta(seconds=110))
    assert f.failures == {"RenderError": 1, "ObjectConflict": 1}
    assert sorted(f.queue_waits) == [10.0, 20.0, 30.0, 50.0] and sorted(f.latencies) == [30.0, 90.0]
    assert f.stages_s == {"text": 1.0, "denoise": 48.0, "decode": 1.0, "encode": 0.4, "upload": 0.2}
    assert f.cancelled_by_reason == {}
    data = json.loads(_report(pg, "night", "--json", sql=True))
    assert data["queue_wait_s"] == {"p50": 25.0, "p95": pytest.approx(47.0), "p99": pytest.approx(49.4), "max": 50.0}
    assert data["render_latency_s"]["p50"] == 60.0 and data["render_latency_s"]["max"] == 90.0
    assert data["throughput"]["span_s"] == 100.0 and data["cost"]["total_usd"] == 0.036
    assert [v["cost_usd"] for v in data["videos"]] == [0.01, 0.02, 0.006, 0.0, 0.0]
    assert _report(pg, "night", "--json", sql=True) == _report(pg, "night", "--json", sql=False)
    assert _report(pg, "night", sql=True) == _report(pg, "night", sql=False)


def test_awkward_values_read_the_same_both_ways(pg):
    rows = [
        _video("v1", Status.SUCCEEDED, start=10.123457, end=40.000001, duration_s=0.1, text_s=0.1, denoise_s=1e-05,
               encode_s=5.0, upload_s=1000000000000000.2, render_s=-0.0, guidance=1e16, prompt=HOSTILE,
               uri="file:///o/ö/v1.mp4", poster_uri="file:///o/ö/v1.jpg", bytes=2**40, sha256="a" * 64,
               image_uri="s3://b/i.png", image_sha256="b" * 64, image_fit="crop", seam_score=0.30000000000000004,
               # Checks as the worker stores them (jobs.render.checks), with floats whose text is long.
               flagged=True, checks=checks_json(2**63 - 1, {"flicker": {"value": 0.30000000000000004, "limit": 50.0,
                                                                        "passed": True},
                                                            "motion": {"value": 1e-05, "limit": 4.0,
                                                                       "passed": False}}, False)),
        _video("v2", Status.SUCCEEDED, start=11, end=99.999999, duration_s=0.2, text_s=0.2, decode_s=123456789012345.0,
               encode_s=4503599627370495.5, seam_score=math.nan, needs_review=True, chunks=3),
        _video("v3", Status.SUCCEEDED, start=12.5, end=13, duration_s=0.3, text_s=0.3, upload_s=1.5e300,
               guidance=math.inf, seam_score=-math.inf,
               checks=with_earlier(checks_json(7, {"blank": {"value": 0.0, "limit": 0.5, "passed": True}}, True),
                                   checks_json(8, {"blank": {"value": 1.0, "limit": 0.5, "passed": False}}, False))),
        _video(HOSTILE, Status.FAILED, start=1, end=2, last_error='failed after 3 attempts: RenderError: "x" \\ y'),
        _video("v5", Status.FAILED, start=3, end=4, last_error=None, attempts=3),
        _video("v6", Status.FAILED, last_error='failed after 3 attempts: RenderError: "x" \\ y'),
        _video("v7", Status.FAILED, last_error="ObjectConflict: s3://b/k holds other bytes"),
        _video("v8", Status.FAILED, last_error="RenderError: another message"),
        _video("v9", Status.CANCELLED, cancel_reason="deadline"),
        _video("v10", Status.CANCELLED, cancel_reason="budget", last_error=HOSTILE),
        _video("v11", Status.CANCELLED, cancel_reason=""),
        _video("v12", Status.CANCELLED, cancel_reason=None),
        _video("v13", Status.CANCELLED, cancel_reason="budget"),
        _video("v14", Status.PENDING, last_error=""),
        _video("v15", Status.RUNNING, start=20),
    ]
    factory = _store(pg, "odd", rows, {"v1": [1503, 43], "v2": [123_456_789], "v3": [1], HOSTILE: [6000, 7]},
                     max_cost_micro_usd=70_000, budget_reached_at=T0 + timedelta(hours=1),
                     deadline=T0 + timedelta(days=1), notify_url="https://h.example/x", reverse=True,
                     session=True)
    # The rows lie in the table last id first, yet the sums add in id order: 0.1 + 0.2 + 0.3 is 0.6000000000000001
    # that way, 0.6 in the table's order.
    run, videos = queries.load_report(factory, "odd")
    with factory() as s:
        f = postgres.figures(s, run, 0)
        listed = [entry(v, micro) for v, micro in postgres.listed_rows(s, run, 2)]
    assert f.video_seconds == 0.6000000000000001 and f.stages_s["text"] == 0.6000000000000001
    assert f.failures == {"RenderError": 3, "unknown": 1, "ObjectConflict": 1}
    assert f.cancelled_by_reason == {"budget": 2, "deadline": 1}
    assert json.dumps(listed) == json.dumps(report_dict(run, videos, listed=2)["videos"])  # as text: NaN != NaN
    assert [v["id"] for v in listed] == ["v1", "v2", HOSTILE, "v6", "v7", "v8", "v10"]

    for args in (("odd", "--json"), ("odd",)):
        assert _report(pg, *args, sql=True) == _report(pg, *args, sql=False)
    # The entries read on a second connection in the same snapshot (REELBATCH_REPORT_PARALLEL) or on the first.
    assert _report(pg, "odd", "--json", sql=True, parallel=False) == _report(pg, "odd", "--json", sql=True)
    printed = _report(pg, "odd", "--json", sql=True)
    # The session's 100 s, 6 of them charged (6 records of 1 s): 94 s idle, $0.94, all this run's (its 3 successes).
    assert json.loads(printed)["cost"]["idle_s"] == 94.0 and json.loads(printed)["cost"]["idle_usd"] == 0.94
    assert '"upload_s": 1000000000000000.2' in printed and '"render_s": -0.0' in printed
    assert '"guidance": Infinity' in printed and '"seam_score": NaN' in printed


def test_an_empty_run_reads_the_same_both_ways(pg):
    _store(pg, "empty", [], {})
    assert _report(pg, "empty", "--json", sql=True) == _report(pg, "empty", "--json", sql=False)
    assert json.loads(_report(pg, "empty", "--json", sql=True))["videos"] == []


# What Python's repr (and so its json module) writes for each double, worked out by hand.
FLOATS = [(5.0, "5.0"), (0.1, "0.1"), (1e-05, "1e-05"), (0.0001, "0.0001"), (-0.0, "-0.0"), (0.0, "0.0"),
          (123456789012345.0, "123456789012345.0"), (1e15, "1000000000000000.0"),
          (1000000000000000.2, "1000000000000000.2"), (-4503599627370495.5, "-4503599627370495.5"),
          (9999999999999998.0, "9999999999999998.0"), (1e16, "1e+16"), (1.5e300, "1.5e+300"),
          (0.30000000000000004, "0.30000000000000004"), (math.inf, "Infinity"), (-math.inf, "-Infinity"),
          (math.nan, "NaN")]


def test_postgres_writes_doubles_as_python_does(pg):
    engine = session_factory(pg).kw["bind"]
    with engine.connect() as conn:
        for value, expected in FLOATS:
            got = conn.execute(text(f"SELECT {postgres._float('x')} FROM (SELECT CAST(:v AS float8) AS x) t"),
                               {"v": value}).scalar_one()
            assert (got, json.dumps(value)) == (expected, expected), value
        assert conn.execute(text(f"SELECT {postgres._float('x')} FROM (SELECT NULL::float8 AS x) t")).scalar_one() \
            == "null"


def test_the_entries_read_beside_the_figures_see_the_same_snapshot(pg):
    """`report --json` reads its entries on a second connection (REELBATCH_REPORT_PARALLEL) in the first one's
    snapshot: a cost recorded and a video finished by a worker that commits after the snapshot was taken are in
    neither the figures nor the entries, though the entries' query runs after that commit (the worker's lock on the
    table holds it back until then) and the first connection's transaction has ended by the time they are read."""
    factory = _store(pg, "live", [_video("v1", Status.SUCCEEDED, start=1, end=2), _video("v2", Status.RUNNING, start=3)],
                     {"v1": [1000]})
    run = queries.find_run(factory, "live")
    with factory() as s, factory() as worker:
        worker.execute(text("LOCK TABLE videos IN ACCESS EXCLUSIVE MODE"))
        worker.add(CostRecord(video_id=1, kind="gpu", seconds=1.0, rate_usd_per_hour=5.41, rate_source="t",
                              amount_micro_usd=500))
        worker.execute(text("UPDATE videos SET status = 'succeeded' WHERE key = 'v2'"))
        worker.flush()
        s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        with postgres.entries_beside(factory, s, run) as later:
            worker.commit()
            figures = postgres.figures(s, run, 1000)
            s.rollback()
            chunks = later.result()
    assert figures.counts["succeeded"] == 1 and figures.counts["running"] == 1
    videos = json.loads("[" + ", ".join(chunks) + "]")
    assert [(v["id"], v["status"], v["cost_usd"]) for v in videos] == [("v1", "succeeded", 0.001),
                                                                       ("v2", "running", 0.0)]
    with factory() as s:  # and the worker's changes are there for the next report
        assert s.execute(text("SELECT count(*) FROM videos WHERE status = 'succeeded'")).scalar_one() == 2
