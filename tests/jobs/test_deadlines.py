"""Deadlines: earlier deadlines go first within a priority; at the deadline, work not started is cancelled (reason
deadline) once, the result files are written and the run reports expired; `status` and the Prometheus gauges show
each run's projected finish against its deadline. The real render path on a controlled clock (tests/jobs/clocked.py)
gives the seconds: 15 s for each video of a batch of two 2-step videos."""

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select, update
from typer.testing import CliRunner

from jobs.claims import claims, leases
from jobs.claims.gate import Gate
from jobs.cli import app
from jobs.db import queries, submission
from jobs.db.base import as_utc, utcnow
from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.errors import UsageError
from jobs.reports.summary import report_dict
from jobs.work import deadlines
from jobs.work.sweeper import Sweeper

from .clocked import RATE, make_world, videos


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def test_a_deadline_ranks_a_run_as_if_queued_twelve_hours_before_it():
    # 2026-12-01T22:00Z is 1796162400 s after the epoch; 20:00Z 1796155200; 19:00Z 1796151600 (`date -u +%s`).
    assert submission.unit_rank(0, at("2026-12-01T22:00:00"), at("2026-12-02T08:00:00")) == -1796155200
    assert submission.unit_rank(0, at("2026-12-01T23:00:00"), at("2026-12-02T07:00:00")) == -1796151600
    # A deadline further than 12 hours away changes nothing: the run queues from its submission.
    assert submission.unit_rank(0, at("2026-12-01T22:00:00"), at("2026-12-03T08:00:00")) == -1796162400
    # Priority 3 without a deadline, submitted at 22:00: 3 x 600 - 1796162400; the 08:00 run above outranks it.
    assert submission.unit_rank(3, at("2026-12-01T22:00:00")) == -1796160600 < -1796155200


@pytest.fixture
def world(tmp_path, db_url, model_cache, registry, monkeypatch):
    return make_world(tmp_path, db_url, model_cache, registry, monkeypatch, worker__max_batch=1)


def test_within_a_priority_earlier_deadlines_go_first(world):
    runs = {name: world.submit(name, videos(name, 1, steps=2), **extra) for name, extra in
            (("none", {}), ("ten", {"deadline": "PT10H"}), ("eight", {"deadline": "PT8H"}))}
    order = [claims.claim_batch(world.factory, owner="w", max_batch=1, lease_s=60).units[0].run_id for _ in runs]
    assert order == [runs["eight"], runs["ten"], runs["none"]]


def pass_deadline(world, run_id):
    """Time passes: the run's deadline is a second ago."""
    with world.factory.begin() as s:
        s.execute(update(Run).where(Run.id == run_id).values(deadline=utcnow() - timedelta(seconds=1)))


def sweeper(world):
    return Sweeper(world.settings, world.factory, threading.Event(), lambda n, model: None, None,
                   world.settings.served_models())


def states(world, run_id):
    with world.factory() as s:
        return [(v.key, Status(v.status).value, v.cancel_reason)
                for v in s.scalars(select(Video).where(Video.run_id == run_id).order_by(Video.id))]


def test_at_the_deadline_work_not_started_is_cancelled_once_and_the_run_expires(world):
    run_id = world.submit("due", videos("v", 3, steps=2), deadline="PT1H")
    assert world.render().succeeded == 1
    running = claims.claim_batch(world.factory, owner="w", max_batch=1, lease_s=60)  # v1, in flight
    pass_deadline(world, run_id)
    gate = Gate(RATE, None)
    assert claims.claim_batch(world.factory, owner="w", max_batch=1, lease_s=60, gate=gate) is None, "v2 not started"
    sweep = sweeper(world)
    sweep.keep_deadlines()
    assert states(world, run_id) == [("v0", "succeeded", None), ("v1", "running", None),
                                     ("v2", "cancelled", "deadline")]
    with world.factory() as s:
        expired_at = s.get(Run, run_id).expired_at
    assert expired_at is not None
    folder = world.folder / "out" / "due"
    assert not (folder / "errors.jsonl").exists(), "v1 still runs: its batch writes the files when recorded"
    sweep.keep_deadlines()
    with world.factory() as s:
        assert s.get(Run, run_id).expired_at == expired_at, "expired once"
    # v1's worker stops before recording it: back to pending, and the next sweep cancels it too.
    leases.release(world.factory, running.units[0])
    sweep.keep_deadlines()
    assert states(world, run_id)[1] == ("v1", "cancelled", "deadline")
    errors = [json.loads(line) for line in (folder / "errors.jsonl").read_text().splitlines()]
    assert [(e["id"], e["code"]) for e in errors] == [("v1", "deadline"), ("v2", "deadline")]
    assert errors[0]["message"].startswith("deadline: not started before run due's deadline 20")
    results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in results] == [("v0", "succeeded"), ("v1", "cancelled"),
                                                         ("v2", "cancelled")]
    assert (folder / "v0.mp4").is_file(), "finished videos are kept"
    row, rows = queries.load_report(world.factory, "due")
    report = report_dict(row, rows)
    assert report["expired"] is True and report["cancelled_by_reason"] == {"deadline": 2}
    assert report["expired_at"] == as_utc(expired_at).isoformat()
    with pytest.raises(UsageError, match="passed its deadline"):
        queries.resume_run(world.factory, "due")
    env = {"REELBATCH_DATABASE_URL": world.settings.database_url, "REELBATCH_CACHE_DIR": str(world.folder),
           "COLUMNS": "200"}
    text = CliRunner().invoke(app, ["report", "due"], env=env)
    assert "EXPIRED at" in text.output and "2 videos not started before it" in text.output
    status = CliRunner().invoke(app, ["status", "due", "--json"], env=env)
    assert json.loads(status.output)["runs"][0]["expired"] is True


def sample(name: str, run: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"run": run})


def test_status_and_the_gauges_show_each_runs_projected_finish_against_its_deadline(world):
    world.settings = world.settings.with_values({"worker.max_batch": 2})
    world.submit("known", videos("k", 2, steps=2))
    world.render_all()  # measured: 15 s a video of this shape
    soon = world.submit("soon", videos("s", 8, steps=2), deadline="PT1M")  # 120 GPU-s: cannot make it
    later = world.submit("later", videos("l", 4, steps=2), deadline="PT1H")  # 60 GPU-s after soon's 120
    with world.factory() as s:
        due = {r.id: as_utc(r.deadline) for r in s.scalars(select(Run).where(Run.id.in_([soon, later])))}
    now = utcnow()
    found = deadlines.project(world.factory, world.settings, now)
    # One worker alive (this test's session), busy 75% of the time.
    assert found[soon].workers == 1 and found[soon].ahead.seconds == 0.0 and found[soon].own.seconds == 120.0
    assert found[soon].finishes_at == now + timedelta(seconds=160)
    assert found[soon].slack_s == pytest.approx((due[soon] - now).total_seconds() - 160)
    assert found[soon].at_risk is True
    assert (found[later].ahead.seconds, found[later].own.seconds) == (120.0, 60.0)
    assert found[later].finishes_at == now + timedelta(seconds=240) and found[later].at_risk is False
    # A service projects against its recent read of the whole queue, each run's own units read now: read before
    # `later` existed, the snapshot still puts `soon`'s 120 s ahead of it and `later`'s own 60 s are counted.
    snapshot = deadlines.QueueSnapshot(world.factory, every_s=3600)
    with world.factory() as s:
        run_later = s.get(Run, later)
    while snapshot._rows is None:  # its thread's first read; no other comes within the hour
        threading.Event().wait(0.05)
    snapshot._rows = [q for q in snapshot._rows if q.run_id != later]
    seen = deadlines.project(world.factory, world.settings, now, [run_later], queue=snapshot)
    assert (seen[later].ahead.seconds, seen[later].own.seconds) == (120.0, 60.0)
    assert seen[later].finishes_at == now + timedelta(seconds=240)
    snapshot.stop()

    gauges = deadlines.Gauges(world.settings)
    gauges.publish(world.factory)
    assert sample("reelbatch_deadline_at_risk", "soon") == 1.0 and sample("reelbatch_deadline_at_risk", "later") == 0.0
    assert sample("reelbatch_deadline_slack_seconds", "soon") < 0 < sample("reelbatch_deadline_slack_seconds", "later")

    env = {"REELBATCH_DATABASE_URL": world.settings.database_url, "REELBATCH_CACHE_DIR": str(world.folder),
           "COLUMNS": "200"}
    status = {r["name"]: r for r in json.loads(
        CliRunner().invoke(app, ["status", "--json"], env=env).output)["runs"]}
    assert (status["soon"]["at_risk"], status["later"]["at_risk"], status["known"]["at_risk"]) == (True, False, None)
    assert status["later"]["projected_finish"] is not None and status["known"]["deadline"] is None
    text = CliRunner().invoke(app, ["status"], env=env).output
    assert "AT RISK" in text and "on time" in text

    # Expired, a run's series go.
    pass_deadline(world, soon)
    sweeper(world).keep_deadlines()
    gauges.publish(world.factory)
    assert sample("reelbatch_deadline_at_risk", "soon") is None
    assert sample("reelbatch_deadline_at_risk", "later") == 0.0
