"""Claims as leases against SQLite and a real PostgreSQL: disjoint claims, expiry, fencing, retries, cancel, resume."""

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from engine.engine import Engine
from jobs.claims import claims, leases
from jobs.cost.prices import Rate
from jobs.db import queries, submission
from jobs.db.base import utcnow
from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.render import keeper, record
from jobs.render.batch import render_next_batch
from jobs.settings import Settings

from .test_db import write_manifest


def submit(factory, registry, tmp_path, n, *, name="r", priority=0, more=""):
    spec = load_manifest(write_manifest(tmp_path, name, priority, [(f"v{i}", f"video {i}", more) for i in range(n)]),
                         registry=registry)
    return submission.submit_run(factory, spec, output=f"file://{tmp_path / 'out'}/")


def statuses(factory):
    with factory() as s:
        return {v.key: Status(v.status) for v in s.scalars(select(Video))}


CLAIMER = """
import json, sys
from jobs.claims import claims
from jobs.db.connect import session_factory
factory = session_factory(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # start together, so the claims really race
taken = []
while (claim := claims.claim_batch(factory, owner=sys.argv[2], max_batch=7, lease_s=600)) is not None:
    taken += [u.unit_id for u in claim.units]
    if len(taken) == len(claim.units):
        # After the first claim, wait for the other process's: on a loaded 2-core machine one process could
        # otherwise take all the work before the other is scheduled, and the race would not be tested.
        print("claimed", flush=True)
        sys.stdin.readline()
print(json.dumps(taken))
"""


def test_two_processes_claim_disjoint_sets(factory, db_url, registry, tmp_path):
    submit(factory, registry, tmp_path, 2000)
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, db_url, f"p{i}"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for i in range(2)]
    assert [p.stdout.readline() for p in procs] == ["ready\n", "ready\n"]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    assert [p.stdout.readline() for p in procs] == ["claimed\n", "claimed\n"]
    taken = [json.loads(p.communicate("go\n", timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert not set(taken[0]) & set(taken[1]), "a unit was claimed twice"
    assert len(taken[0]) + len(taken[1]) == 2000 and all(taken), "both processes claimed, nothing was left"


def test_expired_lease_is_reaped_and_the_old_holder_is_fenced_out(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, 2)
    old = claims.claim_batch(factory, owner="frozen", max_batch=8, lease_s=0.05)
    time.sleep(0.1)
    assert leases.reap_expired(factory, max_attempts=3) == {"tiny": 2}
    assert set(statuses(factory).values()) == {Status.PENDING}
    new = claims.claim_batch(factory, owner="alive", max_batch=8, lease_s=60)
    assert [u.token for u in new.units] == [u.token + 1 for u in old.units]
    out = record.VideoOutput("file:///x.mp4", 1, "ab" * 32, 1.0, 0.0, 0.0)
    rate = Rate(1.0, "test")
    unit = old.units[0]
    assert not record.record_success(factory, unit, out, rate)
    assert not record.record_failure(factory, unit, "late")
    assert record.record_retry(factory, unit, "late", max_attempts=3, backoff_s=0) is None
    assert record.mark_all_uploading(factory, [(unit, "cd" * 32)]) == set()
    assert not leases.release(factory, unit)
    assert leases.renew(factory, old.units, 60) == set()
    assert leases.renew(factory, new.units, 60) == {u.unit_id for u in new.units}
    assert set(statuses(factory).values()) == {Status.RUNNING}, "the late writes changed nothing"


def test_reaping_past_max_attempts_fails_the_video(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, 1)
    for _ in range(2):
        claims.claim_batch(factory, owner="dies", max_batch=1, lease_s=0.01)
        time.sleep(0.05)
        leases.reap_expired(factory, max_attempts=2)
    assert statuses(factory) == {"v0": Status.FAILED}
    with factory() as s:
        video = s.scalar(select(Video))
    assert video.attempts == 2 and "failed after 2 attempts: lease expired" in video.last_error


def test_retry_waits_out_its_backoff_and_a_split_batch_retries_alone(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, 3)
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60)
    for unit in claim.units:
        assert record.record_retry(factory, unit, "boom", max_attempts=3, backoff_s=0.3, solo=True) is True
    assert claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60) is None, "still backing off"
    assert not claims.any_claimable(factory)
    time.sleep(0.35)
    assert claims.any_claimable(factory)
    sizes = []
    while (c := claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60)) is not None:
        sizes.append(len(c.units))
    assert sizes == [1, 1, 1], "units of a failed batch are claimed one at a time"


def test_waiting_work_ages_past_newer_higher_priority_work(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, 1, name="old", priority=0)
    submit(factory, registry, tmp_path, 1, name="new", priority=1, more="    steps: 2\n")
    # Make the priority-0 work 11 minutes older: more than one level of aging (600 s).
    with factory.begin() as s:
        s.execute(update(WorkUnit).where(WorkUnit.priority == 0).values(rank=WorkUnit.rank + 660))
    first = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60)
    assert first.units[0].run_name == "old"
    assert submission.unit_rank(9, utcnow()) > submission.unit_rank(0, utcnow() - timedelta(minutes=89))
    assert submission.unit_rank(9, utcnow()) < submission.unit_rank(0, utcnow() - timedelta(minutes=91))


def test_cancel_and_resume_are_idempotent(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, 3)
    running = claims.claim_batch(factory, owner="w", max_batch=1, lease_s=60)
    assert queries.cancel_run(factory, "r") == ("r", 2)
    assert queries.cancel_run(factory, "r") == ("r", 0)
    assert sorted(statuses(factory).values()) == [Status.CANCELLED, Status.CANCELLED, Status.RUNNING]
    assert leases.cancelled_runs(factory, {running.units[0].run_id}) == {running.units[0].run_id}
    assert leases.release(factory, running.units[0]), "the running batch stops at its step boundary"
    assert set(statuses(factory).values()) == {Status.CANCELLED}
    assert queries.resume_run(factory, "r") == ("r", 3)
    assert queries.resume_run(factory, "r") == ("r", 0)
    assert set(statuses(factory).values()) == {Status.PENDING}
    with factory() as s:
        assert {v.attempts for v in s.scalars(select(Video))} == {0}


def test_a_unit_claimed_while_a_cancel_waits_for_it_stays_with_its_claim(postgres_url, registry, tmp_path):
    """The cancel is one UPDATE whose condition is the unit's own status: PostgreSQL checks it again on the row a
    claim held, so a unit that became running meanwhile is the claim's (it stops at its next step), not cancelled."""
    from concurrent.futures import ThreadPoolExecutor

    from jobs.db.connect import session_factory, upgrade
    from jobs.db.status import move

    upgrade(postgres_url)
    factory = session_factory(postgres_url)
    submit(factory, registry, tmp_path, 2)
    with ThreadPoolExecutor(1) as pool:
        with factory.begin() as s:  # a claim in progress: its unit locked and running, not yet committed
            unit = s.scalars(select(WorkUnit).order_by(WorkUnit.id).limit(1).with_for_update()).one()
            move(unit, s.get(Video, unit.video_id), Status.RUNNING)
            s.flush()
            cancelled = pool.submit(queries.cancel_run, factory, "r")
            time.sleep(1.0)
            assert not cancelled.done(), "the cancel waits for the row the claim holds"
        assert cancelled.result(timeout=60) == ("r", 1)
    assert statuses(factory) == {"v0": Status.RUNNING, "v1": Status.CANCELLED}


class FlakyEngine(Engine):
    """The real engine, except that a batch holding a prompt with BOOM raises (a fault to inject)."""

    def render(self, batch, should_stop=None):
        if any("BOOM" in r.prompt for r in batch.requests):
            raise RuntimeError("simulated kernel crash")
        return super().render(batch, should_stop)


@pytest.fixture
def worker_settings(db_url, model_cache):
    return Settings.from_env({}).with_values({"database_url": db_url, "engine.cache_dir": model_cache,
                                              "worker.max_batch": 4, "limits.max_attempts": 3,
                                              "limits.retry_backoff_s": 0.01, "limits.lease_s": 30})


def drain(settings, engine, factory, limit=30):
    results = []
    for _ in range(limit):
        if not claims.any_claimable(factory):
            time.sleep(0.05)  # a retry may still be backing off
            if not claims.any_claimable(factory):
                break
        results.append(render_next_batch(settings, engine, factory))
    return results


def test_a_video_that_always_raises_fails_after_exactly_n_attempts(factory, registry, tmp_path, worker_settings):
    spec_file = tmp_path / "flaky.yaml"
    spec_file.write_text("name: flaky\ndefaults: {steps: 2}\nvideos:\n  - {id: good1, prompt: fine}\n"
                         "  - {id: bad, prompt: BOOM goes the kernel}\n  - {id: good2, prompt: also fine}\n")
    submission.submit_run(factory, load_manifest(spec_file, registry=registry), output=f"file://{tmp_path}/out/")
    drain(worker_settings, FlakyEngine(worker_settings.engine_config(), registry), factory)
    with factory() as s:
        videos = {v.key: v for v in s.scalars(select(Video))}
        costs = dict(s.execute(select(CostRecord.kind, func.count()).group_by(CostRecord.kind)).all())
        bad_retries = s.scalar(select(func.count()).select_from(CostRecord).join(Video)
                               .where(Video.key == "bad", CostRecord.kind == "retry"))
    assert {k: Status(v.status) for k, v in videos.items()} == {
        "good1": Status.SUCCEEDED, "bad": Status.FAILED, "good2": Status.SUCCEEDED}
    assert videos["bad"].attempts == 3
    assert videos["bad"].last_error == "failed after 3 attempts: RuntimeError: simulated kernel crash"
    assert costs["gpu"] == costs["storage"] == 2 and (tmp_path / "out" / "flaky" / "good1.mp4").is_file()
    assert bad_retries == 3, "each failed attempt is charged to the video that needed it"


def test_a_batch_past_its_time_limit_is_abandoned_and_retried(factory, registry, tmp_path, worker_settings):
    settings = worker_settings.with_values({"limits.time_limit_s": 1e-9, "limits.min_time_limit_s": 0.2,
                                            "limits.max_attempts": 2})
    submit(factory, registry, tmp_path, 2, more="    steps: 200\n")
    engine = Engine(settings.engine_config(), registry)
    first = render_next_batch(settings, engine, factory)
    assert (first.claimed, first.retried) == (2, 2)
    drain(settings, engine, factory)
    with factory() as s:
        videos = list(s.scalars(select(Video)))
    assert {Status(v.status) for v in videos} == {Status.FAILED}
    assert all("batch time limit of 0 s exceeded" in v.last_error and v.attempts == 2 for v in videos)


def test_cancel_stops_a_running_batch_at_a_step_boundary(factory, registry, tmp_path, worker_settings, monkeypatch):
    # 200 steps at 256x256: many seconds of work, past the keeper's cancel check (the registry's tiny renders a
    # 9-frame window, and at 64x64 200 steps could finish on a fast machine before that check). The check runs
    # every 0.5 s here rather than every 5 s, so a fast machine's batch cannot finish between two checks.
    monkeypatch.setattr(keeper, "CANCEL_CHECK_S", 0.5)
    submit(factory, registry, tmp_path, 2, more="    steps: 200\n    resolution: 256x256\n")
    engine = Engine(worker_settings.engine_config(), registry)
    engine.pipeline("tiny")
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=render_next_batch(worker_settings, engine, factory)))
    thread.start()
    deadline = time.monotonic() + 30
    while set(statuses(factory).values()) != {Status.RUNNING} and time.monotonic() < deadline:
        time.sleep(0.05)
    queries.cancel_run(factory, "r")
    started = time.monotonic()
    thread.join(timeout=60)
    assert time.monotonic() - started < 10, "200 steps would take far longer: it stopped at a step boundary"
    assert result["r"].released == 2
    assert set(statuses(factory).values()) == {Status.CANCELLED}
    folder = tmp_path / "out" / "r"
    assert not [*folder.glob("*.mp4"), *folder.glob("*.jpg")], "nothing was uploaded"
    # The worker noticed the run finished by the cancel and wrote its result files (jobs.notify.finished).
    assert [json.loads(line)["code"] for line in (folder / "errors.jsonl").read_text().splitlines()] == \
        ["cancelled", "cancelled"]


def test_a_batch_first_asks_about_a_cancel_one_check_interval_after_its_claim(factory, registry, tmp_path,
                                                                               monkeypatch):
    """The claim found the run not cancelled (a cancel takes its waiting units), so the keeper's first ask is one
    interval after it, not at the first step; a cancel in between stops the batch at the first step after that."""
    monkeypatch.setattr(keeper, "CANCEL_CHECK_S", 0.3)
    asked = []
    real = leases.cancelled_runs
    monkeypatch.setattr(leases, "cancelled_runs", lambda *args: asked.append(time.monotonic()) or real(*args))
    submit(factory, registry, tmp_path, 2)
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=600)
    with keeper.LeaseKeeper(factory, claim, 600, time.monotonic() + 60) as kept:
        claimed_at = time.monotonic()
        queries.cancel_run(factory, "r")
        assert kept.should_stop() is None and asked == [], "asked at the first step"
        while (stop := kept.should_stop()) is None:
            time.sleep(0.01)
    assert stop is keeper.Stop.CANCELLED and len(asked) == 1 and 0.25 <= asked[0] - claimed_at < 2.0
