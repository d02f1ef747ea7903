"""`reelbatch scale`: the desired worker count for hand-worked queues on real rows (SQLite and PostgreSQL), the rule
(jobs.cost.scale) and KEDA's one statement (jobs.db.scale_queries) giving the same number; the workers that may go;
the gauge; the command's JSON, its --sql (the one docs/OPERATIONS.md shows) and its bad input.

Every queue stands on one history, written as the render path leaves finished videos: a 2-step video of tiny charged
15 s, a 4-step one 25 s (tests/jobs/test_estimate.py renders such a ledger; here the rows alone, so a test takes
under a second)."""

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY
from sqlalchemy import select, text
from typer.testing import CliRunner

from jobs.claims import claims
from jobs.cli import app
from jobs.cost import scale as rule
from jobs.cost.meter import Meter
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.scale_queries import desired_workers_sql
from jobs.db.status import Status, move
from jobs.manifest import load_manifest
from jobs.observe import prometheus
from jobs.settings import Settings
from jobs.usecases import scale as scaling

from .clocked import RATE, videos

DOCS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"


@dataclass
class World:
    settings: Settings
    factory: object
    folder: Path
    registry: object

    def submit(self, name: str, videos: list[dict], **run: object) -> int:
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "model": "tiny", **run, "videos": videos}, sort_keys=False))
        spec = load_manifest(path, registry=self.registry)
        return submission.submit_run(self.factory, spec, output=f"file://{self.folder / 'out'}/").run_id


@pytest.fixture
def world(tmp_path, db_url, registry):
    """The history: run `history`'s videos finished as the render path leaves them (succeeded, one "gpu" charge
    each): four 2-step videos charged 15 s, two 4-step ones 25 s."""
    settings = Settings.from_env({}).with_values({"database_url": db_url, "engine.cache_dir": tmp_path / "cache"})
    w = World(settings, session_factory(db_url), tmp_path, registry)
    run = w.submit("history", videos("a", 4, steps=2) + videos("b", 2, steps=4))
    with w.factory.begin() as s:
        for video in s.scalars(select(Video).where(Video.run_id == run)):
            (unit,) = s.scalars(select(WorkUnit).where(WorkUnit.video_id == video.id))
            move(unit, video, Status.RUNNING)
            move(unit, video, Status.SUCCEEDED)
            seconds = 15.0 if video.steps == 2 else 25.0
            s.add(CostRecord(video_id=video.id, kind="gpu", seconds=seconds, rate_usd_per_hour=RATE.usd_per_hour,
                             rate_source=RATE.source, amount_micro_usd=int(seconds * 1000)))
    Meter(RATE, w.factory, "test-worker").open()
    return w


def by_query(world, model=None) -> int:
    dialect = "sqlite" if world.settings.database_url.startswith("sqlite") else "postgresql"
    with world.factory() as s:
        return s.execute(text(desired_workers_sql(dialect, model, rule.DRAIN_HORIZON_S, rule.COLD_START_S))).scalar()


def signal(world):
    """The use case's answer and the query's, which must agree."""
    found = scaling.scale(world.settings)
    assert by_query(world) == found.desired, "KEDA's query gives the function's count"
    return found


def test_an_idle_queue_wants_no_worker_and_every_idle_worker_may_go(world):
    found = signal(world)
    assert (found.desired, found.models) == (0, [])
    assert [(w.owner, w.busy) for w in found.workers] == [("test-worker", False)]
    assert found.may_go == ["test-worker"]


def test_a_backlog_wants_its_measured_seconds_over_the_horizon(world):
    # 50 x 15 s + 10 x 25 s = 1000 GPU-s over 600 s: 1.67, two workers. The 3-step videos have no measured video:
    # no seconds, counted apart.
    world.submit("backlog", videos("c", 50, steps=2) + videos("d", 10, steps=4) + videos("e", 3, steps=3))
    found = signal(world)
    (tiny,) = found.models
    assert (tiny.model, tiny.desired, tiny.busy, tiny.backlog_s, tiny.backlog_workers) == ("tiny", 2, 0, 1000.0, 2)
    assert (tiny.deadline_workers, tiny.deadline, tiny.units, tiny.unmeasured_units) == (0, None, 63, 3)
    assert by_query(world, "tiny") == 2 and by_query(world, "other") == 0


def test_unmeasured_work_alone_still_wants_one_worker(world):
    world.submit("new-shape", videos("n", 40, steps=3))
    found = signal(world)
    assert (found.desired, found.models[0].backlog_s, found.models[0].unmeasured_units) == (1, 0.0, 40)


def test_a_near_deadline_wants_more_workers_than_the_backlog(world):
    world.submit("soon", videos("s", 80, steps=2), deadline="PT8M")  # 1200 GPU-s
    world.submit("later", videos("l", 20, steps=2), deadline="PT1H")  # 300 GPU-s
    world.submit("too-late", videos("t", 4, steps=4), deadline="PT1M")  # 100 GPU-s, due inside a cold start
    found = signal(world)
    (tiny,) = found.models
    # Backlog: 1600 GPU-s over 600 s, 2.67: three. Due by "soon": its 1200 s and too-late's 100 s, over 480 s less the
    # 120 s cold start (less the seconds this test took): 1300 / 360 = 3.6, four. By "later": 1600 / 3480, one.
    # "too-late"'s own deadline is closer than a cold start: no new worker can help it.
    assert (tiny.backlog_s, tiny.backlog_workers, tiny.deadline_workers, tiny.desired) == (1600.0, 3, 4, 4)
    with world.factory() as s:
        (soon,) = s.execute(text("SELECT deadline FROM runs WHERE name = 'soon'")).scalars()
    assert tiny.deadline[:19] == str(soon)[:19].replace(" ", "T")


def test_claimed_work_counts_though_nothing_is_queued(world):
    run = world.submit("claimed", videos("k", 100, steps=4))  # 2500 GPU-s
    for owner in ("host-a:1", "host-b:1"):
        Meter(RATE, world.factory, owner).open()
        claim = claims.claim_batch(world.factory, owner=owner, max_batch=50, lease_s=300.0)
        assert len(claim.units) == 50
    Meter(RATE, world.factory, "host-a:2").open()  # idle, beside a busy one: its host may not go
    Meter(RATE, world.factory, "host-c:1").open()  # idle, alone
    with world.factory() as s:
        pending = s.execute(text(f"SELECT COUNT(*) FROM work_units u JOIN videos v ON v.id = u.video_id "
                                 f"WHERE v.run_id = {run} AND u.status = 'pending'")).scalar()
    assert pending == 0, "a queue-length scaler would see nothing"
    found = signal(world)
    (tiny,) = found.models
    # 2500 over 600 s: 4.17, five workers; two are busy.
    assert (tiny.busy, tiny.backlog_s, tiny.backlog_workers, tiny.desired) == (2, 2500.0, 5, 5)
    assert [(w.owner, w.leases, w.busy) for w in found.workers] == [
        ("test-worker", 0, False), ("host-a:1", 50, True), ("host-b:1", 50, True), ("host-a:2", 0, False),
        ("host-c:1", 0, False)]
    assert found.may_go == ["test-worker", "host-c"]


def test_the_gauges(world):
    world.submit("backlog", videos("c", 50, steps=2) + videos("d", 10, steps=4))
    prometheus.publish_scale(rule.signals_now(world.factory))
    assert REGISTRY.get_sample_value("reelbatch_desired_workers", {"model": "tiny"}) == 2.0
    prometheus.publish_scale([])  # its work gone: it reads 0, not absent
    assert REGISTRY.get_sample_value("reelbatch_desired_workers", {"model": "tiny"}) == 0.0
    busy = threading.Event()
    prometheus.watch_busy(busy)
    assert REGISTRY.get_sample_value("reelbatch_worker_busy") == 0.0
    busy.set()
    assert REGISTRY.get_sample_value("reelbatch_worker_busy") == 1.0


def invoke(world, *args):
    env = {"REELBATCH_DATABASE_URL": world.settings.database_url, "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


def test_the_command(world):
    world.submit("backlog", videos("c", 50, steps=2) + videos("d", 10, steps=4))
    done = invoke(world, "scale", "--json", "--horizon-s", "300")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    # 1000 GPU-s over 300 s: 3.33, four.
    assert (data["desired"], data["horizon_s"], data["cold_start_s"], data["may_go"]) == (4, 300.0, 120.0,
                                                                                        ["test-worker"])
    assert [(m["model"], m["desired"], m["backlog_s"]) for m in data["models"]] == [("tiny", 4, 1000.0)]
    shown = invoke(world, "scale")
    assert shown.exit_code == 0 and "desired workers: 2" in shown.stdout and "may go" in shown.stdout


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("args, message", [
    (["--horizon-s", "0"], "--horizon-s must be above 0, got 0.0"),
    (["--cold-start-s", "-1"], "--cold-start-s must be 0 or more, got -1.0"),
    (["--model", "x'; DROP TABLE runs; --"], "--model: not a model name, got \"x'; DROP TABLE runs; --\""),
])
def test_bad_input_is_one_line_and_exit_2(world, args, message):
    for extra in ([], ["--sql"]):
        done = invoke(world, "scale", *args, *extra)
        assert done.exit_code == 2 and "Traceback" not in done.output
        assert message in done.output.strip().splitlines()[-1], done.output


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_documented_query_is_the_one_the_command_prints(world):
    printed = invoke(world, "scale", "--sql", "--model", "wan-1.3b")
    assert printed.exit_code == 0
    block = re.search(r"```sql\n(WITH clock.*?)\n```", DOCS.read_text(), re.S)
    assert block is not None and block.group(1) == printed.stdout.rstrip("\n")


def test_the_cold_start_is_what_recent_workers_measured(world):
    # Three sessions measured their first video at 30, 90 and 60 s: the median, 60 s, is the cold start. A run of
    # four 4-step videos (100 GPU-s) due in 110 s: at the default 120 s no new worker starts in time (deadline part
    # 0, one worker while work waits); at 60 s, 100 GPU-s over the 50 s left (less the seconds this test took, under
    # 16 s) wants 3.
    for seconds in (30.0, 90.0, 60.0):
        meter = Meter(RATE, world.factory, "other-worker")
        meter.open()
        meter.record_cold_start(seconds)
        meter.record_cold_start(seconds + 1000)  # once: the first video's
    world.submit("soon", videos("s", 4, steps=4), deadline="PT110S")
    found = scaling.scale(world.settings)
    assert (found.cold_start_s, found.desired) == (60.0, 3)
    assert found.cold_start_source == "measured: the median of the last 3 worker sessions' first video stored"
    given = scaling.scale(world.settings, cold_start_s=120.0)
    assert (given.cold_start_s, given.cold_start_source, given.desired) == (120.0, "--cold-start-s", 1)
