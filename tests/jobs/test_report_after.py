"""Reports that add up once a run has ended, on the real render path and a controlled clock (tests/jobs/clocked.py:
a batch renders 10 s a step, an encode takes 5 s, a second costs 1000 micro-dollars): a finished run's report (JSON,
text, HTML, and PostgreSQL's own counting) is the same byte for byte a minute later with its worker idle and up; a
long video's chunks are not attempts, in the report and in capacity's retry rate."""

import io
import json

import pytest
from rich.console import Console

from jobs.cost import ledger
from jobs.manifest import keys
from jobs.reports.text import print_report
from jobs.usecases import reports
from storage.stores import StoreUnavailable

from .clocked import make_world, videos


@pytest.fixture
def world(tmp_path, db_url, model_cache, registry, monkeypatch):
    """On both databases (tests/jobs/conftest.py)."""
    return make_world(tmp_path, db_url, model_cache, registry, monkeypatch)


def _snapshot(w, run: str, page) -> tuple:
    """Everything a person or a script reads of the run's report now."""
    data = reports.report(w.settings, run)
    text = io.StringIO()
    print_report(Console(file=text, width=200), data)
    reports.write_html(w.settings, run, page, warn=lambda line: pytest.fail(line))
    sql = None
    if reports.in_sql(w.settings):
        found = reports.report_in_sql(w.settings, run, with_entries=True, listed=100)
        sql = (json.dumps(found.data), found.entries)
    return json.dumps(data), text.getvalue(), page.read_bytes(), sql


def test_a_finished_runs_report_is_the_same_a_minute_later_with_its_worker_idle(world, tmp_path):
    w = world
    w.clock.advance(30)  # loading the model: idle before the run's work, so the run's
    w.submit("done", videos("v", 3, steps=2))
    assert w.render().succeeded == 2  # 30 -> 60: 20 s of render, two encodes of 5 s
    w.clock.advance(20)  # waiting between batches: the run's too
    assert w.render().succeeded == 1  # 80 -> 105: 20 s of render, one encode
    assert w.render().claimed == 0, "the run is done"
    # Read at once, before any heartbeat: the session row already says when its last work ended.
    before = _snapshot(w, "done", tmp_path / "before.html")
    for _ in range(2):  # a minute up with nothing to do, heartbeating as a worker does
        w.clock.advance(30)
        w.meter.heartbeat()
    after = _snapshot(w, "done", tmp_path / "after.html")
    assert after == before
    # Charged: 2 x (20 / 2 + 5) + (20 + 5) = 55 s. Idle before its last work (105 s): 30 + 20 = 50 s, all this
    # run's, $0.050000. The minute after is the ledger's alone: the session's idle is 110 s.
    data = json.loads(after[0])
    assert data["cost"]["idle_usd"] == 0.05 and data["cost"]["idle_s"] == 50.0
    assert data["cost"]["by_kind_usd"]["gpu"] == pytest.approx(0.055)
    assert "+ $0.050000 idle worker time (50.0 s, its share)" in after[1]
    assert "+ $0.050000 idle worker time (50.0 s, its share)" in after[2].decode()
    (session,) = ledger.sessions(w.factory)
    assert (session.state, session.up_s, session.charged_s) == ("open", 165.0, 55.0)
    assert (session.idle_s, session.spread_s, session.spread_micro_usd) == (110.0, 50.0, 50_000)


def _long_and_short(w, name: str) -> None:
    # 9 s of tiny is 73 frames: 3 chunks of its 33-frame window (tests/e2e/test_run.py); 4 s is one window.
    w.submit(name, [{"id": "long", "prompt": "a long one", "duration_s": 9, "steps": 1},
                    {"id": "short", "prompt": "a short one", "duration_s": 4, "steps": 1}])
    w.render_all()


def _attempts(w, run: str) -> dict:
    data = reports.report(w.settings, run)
    found = {v["id"]: (v["chunks"], v["attempts"]) for v in data["videos"]}
    if reports.in_sql(w.settings):  # PostgreSQL's own entries say the same
        entries = reports.report_in_sql(w.settings, run, with_entries=True, listed=100).entries
        counted = json.loads("[" + ", ".join(entries) + "]")
        assert {v["id"]: (v["chunks"], v["attempts"]) for v in counted} == found
    return found


def test_a_long_videos_chunks_are_not_attempts(world):
    w = world
    _long_and_short(w, "chunked")
    assert _attempts(w, "chunked") == {"long": (3, 1), "short": (1, 1)}
    plan = reports.capacity(w.settings, "chunked", gpus=1, run_gpus=1, headroom=0.2)
    assert plan["assumptions"]["retry_rate"] == 0.0
    sustainable, budget = plan["levels"][1:]
    assert budget["videos_per_hour"] == pytest.approx(sustainable["videos_per_hour"] * 0.8)  # headroom only


def test_a_retried_chunk_is_one_more_attempt(world, monkeypatch):
    """The store refuses the long video's MP4 once: its last chunk renders again. 2 attempts; capacity's retry rate
    is 1 retry in 5 renders (the long video's 3 chunks and its retry, the short video's one)."""
    w = world
    real_store_for = keys.store_for
    refused = []

    class FlakyStore:
        def __init__(self, store):
            self.store = store

        def put(self, key, *args, **kwargs):
            if key.endswith("/long.mp4") and not refused:
                refused.append(key)
                raise StoreUnavailable("the store is down for this one upload")
            return self.store.put(key, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.store, name)

    monkeypatch.setattr(keys, "store_for", lambda prefix: FlakyStore(real_store_for(prefix)))
    _long_and_short(w, "retried")
    assert refused, "the refused upload happened"
    assert _attempts(w, "retried") == {"long": (3, 2), "short": (1, 1)}
    plan = reports.capacity(w.settings, "retried", gpus=1, run_gpus=1, headroom=0.2)
    assert plan["assumptions"]["retry_rate"] == pytest.approx(0.2)
    sustainable, budget = plan["levels"][1:]
    assert budget["videos_per_hour"] == pytest.approx(sustainable["videos_per_hour"] * 0.8 * 0.8)
