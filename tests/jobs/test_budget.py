"""Budgets: a run with `max_cost_usd` never starts a batch that would take it past its cap. Driven through the real
render path on a controlled clock (tests/jobs/clocked.py): one second costs 1000 micro-dollars, a 2-step batch
renders in 20 s (shared by its videos) and each encode takes 5 s, so every charge below is worked out by hand."""

import hashlib
import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from jobs.claims import claims, leases
from jobs.claims.gate import Gate
from jobs.cli import app
from jobs.db import limits, queries, submission
from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.summary import report_dict

from .clocked import RATE, make_world, videos


@pytest.fixture
def world(tmp_path, db_url, model_cache, registry, monkeypatch):
    return make_world(tmp_path, db_url, model_cache, registry, monkeypatch)


def states(world, run_id):
    with world.factory() as s:
        return [(v.key, Status(v.status).value, v.cancel_reason)
                for v in s.scalars(select(Video).where(Video.run_id == run_id).order_by(Video.id))]


def charged(world, run_id) -> int:
    with world.factory() as s:
        return limits.charged_micro_usd(s, run_id)


def test_a_run_stops_at_its_budget_and_raising_it_continues(world, tmp_path):
    run_id = world.submit("capped", videos("v", 5, steps=2), max_cost_usd=0.07)
    # 1. Nothing is known of this shape: one video starts alone (batch of 1: 20 s render + 5 s encode = $0.025).
    assert world.render().claimed == 1
    assert charged(world, run_id) == 25_000
    # 2. Measured now at 25 s a video: $0.025 + $0.025 fits under $0.07, a third would not: a batch of 1 again.
    assert world.render().claimed == 1
    assert charged(world, run_id) == 50_000
    # 3. $0.05 charged, nothing in flight, and $0.025 more would pass $0.07: the budget is reached.
    assert world.render().claimed == 0
    assert states(world, run_id) == [("v0", "succeeded", None), ("v1", "succeeded", None),
                                     ("v2", "cancelled", "budget"), ("v3", "cancelled", "budget"),
                                     ("v4", "cancelled", "budget")]
    assert charged(world, run_id) <= 70_000

    # The result files and the report say so.
    folder = world.folder / "out" / "capped"
    errors = [json.loads(line) for line in (folder / "errors.jsonl").read_text().splitlines()]
    assert [(e["id"], e["code"]) for e in errors] == [("v2", "budget"), ("v3", "budget"), ("v4", "budget")]
    assert errors[0]["message"] == ("budget: not started: run capped has been charged $0.050000 of its max_cost_usd "
                                    "$0.070000, and its next video was estimated at $0.025000")
    row, rows = queries.load_report(world.factory, "capped")
    report = report_dict(row, rows)
    assert report["max_cost_usd"] == 0.07 and report["budget_reached_at"] is not None
    assert report["cancelled_by_reason"] == {"budget": 3} and report["counts"]["cancelled"] == 3
    stored = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in ("v0.mp4", "v1.mp4")}

    # Raising the budget puts the three back; they render within the new cap. Nothing stored is touched.
    env = {"REELBATCH_DATABASE_URL": world.settings.database_url,
           "REELBATCH_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.db'}", "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["budget", "capped", "0.2"], env=env)
    assert result.exit_code == 0, result.output
    assert "max_cost_usd $0.2 (charged $0.050000 so far); 3 videos cancelled for the budget are back" in result.output
    assert [st for _, st, _ in states(world, run_id)][2:] == ["pending"] * 3
    # $0.15 of room: two at the measured $0.025 fit in one batch (15 s each), then the last alone (25 s).
    assert world.render_all() == 2
    assert states(world, run_id) == [(f"v{i}", "succeeded", None) for i in range(5)]
    assert charged(world, run_id) == 50_000 + 15_000 * 2 + 25_000
    assert {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in stored} == stored
    assert (folder / "errors.jsonl").read_text() == "", "rewritten once the run was done again"
    status = json.loads(CliRunner().invoke(app, ["status", "capped", "--json"], env=env).output)["runs"][0]
    assert (status["max_cost_usd"], status["charged_usd"], status["budget_reached"]) == (0.2, 0.105, False)
    with world.factory() as s:
        assert s.scalar(select(Run.budget_reached_at).where(Run.id == run_id)) is None


def test_resume_continues_a_stopped_run_and_the_cap_still_holds(world):
    run_id = world.submit("tight", videos("v", 3, steps=2), max_cost_usd=0.03)
    world.render_all()  # one alone ($0.025), then $0.025 more would pass $0.03
    assert [st for _, st, _ in states(world, run_id)] == ["succeeded", "cancelled", "cancelled"]
    assert queries.resume_run(world.factory, "tight") == ("tight", 2)
    assert world.render().claimed == 0, "resumed, but the cap still stops them"
    assert [r for _, _, r in states(world, run_id)] == [None, "budget", "budget"]
    limits.set_budget(world.factory, "tight", None)  # no cap: the run finishes
    world.render_all()
    assert [st for _, st, _ in states(world, run_id)] == ["succeeded"] * 3


def test_a_run_whose_next_batch_waits_on_one_in_flight_is_held_not_stopped(world):
    """Two workers: the first holds all the capped run can afford, so the second passes it over for other work and
    cancels nothing; what the batch in flight is charged decides."""
    world.submit("known", videos("k", 2, steps=2))
    world.render_all()  # measured: 15 s a video of this shape
    capped = world.submit("capped", videos("c", 4, steps=2), max_cost_usd=0.04, priority=5)
    other = world.submit("other", videos("o", 2, steps=2))
    gate = Gate(RATE, world.settings.prices.storage)

    def claim():
        return claims.claim_batch(world.factory, owner="w", max_batch=2, lease_s=60, gate=gate)

    first = claim()
    assert [u.run_id for u in first.units] == [capped, capped], "2 x $0.015 fits in $0.04"
    second = claim()
    assert [u.run_id for u in second.units] == [other, other], "$0.03 in flight leaves room for no third"
    assert claim() is None
    assert [st for _, st, _ in states(world, capped)] == ["running", "running", "pending", "pending"]
    for unit in first.units:  # the first worker stops without rendering: nothing was charged
        leases.release(world.factory, unit)
    assert [u.run_id for u in claim().units] == [capped, capped]


def test_budget_refuses_bad_input_and_unknown_runs(tmp_path, registry):
    from jobs.db.connect import session_factory
    from jobs.manifest import load_manifest

    url = f"sqlite:///{tmp_path / 'r.db'}"
    manifest = tmp_path / "m.yaml"
    manifest.write_text("name: m\nmax_cost_usd: 1\nvideos:\n  - {id: a, prompt: p}\n")
    submission.submit_run(session_factory(url), load_manifest(manifest, registry=registry), output="file:///tmp/o/")
    env = {"REELBATCH_DATABASE_URL": url, "COLUMNS": "200"}
    for args, message in ((["m", "--", "-1"], "USD: must be more than 0 and at most 100000, got -1"),
                          (["m", "lots"], "USD: must be a number, got 'lots'"),
                          (["nosuch", "5"], "no run named or numbered 'nosuch'")):
        result = CliRunner().invoke(app, ["budget", *args], env=env)
        assert (result.exit_code, message in result.output) == (2, True), result.output
    with session_factory(url)() as s:
        assert s.scalar(select(Run.max_cost_micro_usd)) == 1_000_000, "unchanged"
