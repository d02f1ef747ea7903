"""Crash safety with many workers: real `reelbatch worker` processes are killed, frozen, cut off from the store or
the database in the middle of a run, and every video must still end succeeded exactly once.

Production parts throughout: PostgreSQL, a Redis broker, an S3-protocol server (moto), all on loopback. Two workers
share each run; leases are a few seconds, so a dead or frozen worker's batch is reaped and rendered by the other
within seconds. The checks are the same everywhere (`check_exactly_once`): every video succeeded; one object per
video in the bucket, never overwritten (the bucket is versioned, so an overwrite would leave a second version),
holding the bytes whose SHA-256 the database recorded; one cost record per video.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import psycopg
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from jobs.db.connect import upgrade
from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.status import Status
from storage.encode import probe_mp4
from tests import services

from .conftest import Cli
from .procs import TcpGate, Workers, wait_for

# Short leases so a dead worker's batch comes back within seconds; the sweeper then runs every 1.25 s
# (jobs.work.sweeper: lease_s / 4, at least 1 s) and a holder renews every 1.7 s (jobs.render.batch.LeaseKeeper: lease_s / 3).
LEASE_S = 5
VIDEOS = 12
MAX_BATCH = 3
# 100 denoising steps of 33 frames of 192x192 (4 s at tiny's 8 fps, its window): a warm batch of 3 renders for about
# 3.8 s on a quiet core of this machine, long enough to catch and interrupt mid-render. At tiny's own 64x64 and 9
# frames it took 0.4 s there, and the tests could not find a worker mid-render (3 s when they were written, on a
# busier machine).
STEPS = 100
RESOLUTION, DURATION_S = "192x192", 4.0
# The first videos of a run are tiny's own small shape (64x64, 9 frames, 4 steps; their own batches, since a batch is
# one shape): a worker's first batch, which loads the model, renders in a moment, and the batches of the shape above
# after them, those caught mid-render, are rendered warm. With every video of that shape, two of a run's four
# batches were cold (27-33 s each on a loaded machine against 13-20 s warm) and mostly served to warm up.
WARMUP = 6
RUN = "faults"
# Bounds for one run of 12 videos on 2 busy cores, generous because the CPU is shared with the test and the servers.
RUN_TIMEOUT_S = 120


@dataclass
class Farm:
    """One run's world: the settings every process shares, the test's own views of the database and the bucket."""

    env: dict
    cwd: Path
    db: Engine
    s3: object
    bucket: str
    videos: int = VIDEOS  # all of them, WARMUP included
    warmup: int = WARMUP
    steps: int = STEPS
    resolution: str = RESOLUTION
    duration_s: float = DURATION_S

    def cli(self, *args: str, timeout: float = 120):
        return Cli(self.cwd, self.env)(*args, timeout=timeout)

    def submit(self) -> dict:
        manifest = self.cwd / "faults.yaml"
        head = (f"name: {RUN}\ndefaults:\n  steps: {self.steps}\n  resolution: {self.resolution}\n"
                f"  duration_s: {self.duration_s}\nvideos:\n")
        small = "    steps: 4\n    resolution: 64x64\n    duration_s: 1\n"
        manifest.write_text(head + "".join(f"  - id: v{i:02d}\n    prompt: fault test video {i}\n"
                                           + (small if i < self.warmup else "") for i in range(self.videos)))
        return json.loads(self.cli("submit", str(manifest), "--json").stdout)

    def long(self, held: dict) -> bool:
        """Are the units `held` (id -> row) of the run's long shape, not warm-ups?"""
        with self.db.connect() as conn:
            steps = set(conn.scalars(select(Video.steps).where(Video.id.in_([u.video_id for u in held.values()]))))
        return steps == {self.steps}

    def units(self) -> list:
        with self.db.connect() as conn:
            return list(conn.execute(select(WorkUnit.id, WorkUnit.video_id, WorkUnit.status, WorkUnit.lease_owner,
                                            WorkUnit.lease_token, WorkUnit.attempts).order_by(WorkUnit.id)))

    def counts(self) -> dict[str, int]:
        with self.db.connect() as conn:
            return {Status(status).value: n for status, n in
                    conn.execute(select(Video.status, func.count()).group_by(Video.status))}

    def done(self) -> bool:
        counts = self.counts()
        return sum(counts.values()) == self.videos and not counts.get("pending") and not counts.get("running")

    def snapshot(self) -> dict:
        """Every row a late write could touch, whole (updated_at included: any ORM update moves it). Leaves out the
        "lost" charges a sweeper adds when it closes a silent worker's session (jobs.cost.ledger): not the late writer's."""
        with self.db.connect() as conn:
            rows = {table.name: [tuple(r) for r in conn.execute(select(table).order_by(table.c.id))]
                    for table in (Video.__table__, WorkUnit.__table__)}
            rows["cost_records"] = [tuple(r) for r in conn.execute(
                select(CostRecord.__table__).where(CostRecord.kind != "lost").order_by(CostRecord.id))]
            return rows

    def versions(self) -> tuple[list, list]:
        listing = self.s3.list_object_versions(Bucket=self.bucket, Prefix=f"renders/{RUN}/")
        return listing.get("Versions", []), listing.get("DeleteMarkers", [])


def make_farm(tmp_path: Path, cli_env: dict, *, database_url: str, broker_url: str, bucket: str,
              endpoint_url: str | None = None, videos: int = VIDEOS, warmup: int = WARMUP, steps: int = STEPS,
              resolution: str = RESOLUTION, duration_s: float = DURATION_S, **settings: object) -> Farm:
    env = {**cli_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    env.update(
        REELBATCH_DATABASE_URL=database_url, REELBATCH_BROKER_URL=broker_url,
        REELBATCH_OUTPUT=f"s3://{bucket}/renders/",
        # A queue of this test's own: the Redis server is shared by the whole session.
        REELBATCH_QUEUE=f"faults-{uuid.uuid4().hex[:8]}",
        REELBATCH_LEASE_S=str(LEASE_S), REELBATCH_MAX_BATCH=str(MAX_BATCH), REELBATCH_DEVICE="cpu",
        # Two workers on two cores: one thread each renders faster than two threads each fighting.
        OMP_NUM_THREADS="1",
    )
    if endpoint_url:
        env["AWS_ENDPOINT_URL"] = endpoint_url
    env.update({f"REELBATCH_{k.upper()}": str(v) for k, v in settings.items()})
    s3 = boto3.session.Session().client("s3")  # the test's own view: straight to moto, never through a gate
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    farm = Farm(env, tmp_path, create_engine(database_url, poolclass=NullPool), s3, bucket, videos, warmup, steps,
                resolution, duration_s)
    # In this process, not through `reelbatch db upgrade` (a CLI start-up per test): test_run.py's S3 test and the
    # fleet and notify tests run that command on PostgreSQL.
    upgrade(database_url)
    return farm


def running_unit(farm: Farm, workers: Workers):
    """A unit being rendered right now, and the worker holding it, once the run is under way (a video succeeded)."""
    if not farm.counts().get("succeeded"):
        return None
    for unit in farm.units():
        if unit.status == "running":
            holder = workers.holding(unit.lease_owner)
            if holder is not None:
                return unit, holder
    return None


def rendering_holder(farm: Farm, workers: Workers, only=None):
    """A warm worker (`only` that one, if given) in the middle of rendering a batch, with the units it holds (id ->
    row); else None.

    Warm: it has finished a ticket, so the model is loaded. Mid-render: every unit of its batch is still running
    (while it stores, they succeed one by one) and the task that claimed them has not returned (with overlap, a
    batch is stored after its task returns: a worker frozen then would have no ticket to end when thawed).
    """
    by_owner: dict[str, dict] = {}
    for unit in farm.units():
        if unit.status == "running":
            by_owner.setdefault(unit.lease_owner, {})[unit.id] = unit
    for owner, held in by_owner.items():
        holder = workers.holding(owner)
        if holder is None or (only is not None and holder is not only):
            continue
        if len(held) == MAX_BATCH and holder.tasks_done() >= 1 and holder.mid_render():
            return holder, held
    return None


def stop_a_holder(farm: Farm, workers: Workers):
    """SIGSTOP a warm worker in the middle of rendering a batch; return it and the units it holds, once frozen.

    Frozen first, then read again: the batch can no longer change under the test. If it got past rendering between
    the read and the signal, it is thawed and None returned, to be asked again.
    """
    found = rendering_holder(farm, workers)
    if found is None:
        return None
    holder, held = found
    holder.signal(signal.SIGSTOP)
    now = {u.id: u for u in farm.units() if u.id in held}
    if any(now[uid] != unit for uid, unit in held.items()):
        holder.signal(signal.SIGCONT)
        return None
    return holder, held


def wait_done(farm: Farm, workers: Workers, timeout: float = RUN_TIMEOUT_S) -> None:
    wait_for("every video to finish", farm.done, timeout,
             diagnose=lambda: f"counts {farm.counts()}\nunits {farm.units()}\nsessions {_activity(farm)}\n"
             + workers.tails())


def check_exactly_once(farm: Farm) -> dict:
    """Every video succeeded once: one object (one version) holding the recorded bytes, and one cost record."""
    report = json.loads(farm.cli("report", RUN, "--json").stdout)
    videos = report["videos"]
    assert [v["status"] for v in videos] == ["succeeded"] * farm.videos, [(v["id"], v["status"], v["error"])
                                                                          for v in videos]
    (run,) = json.loads(farm.cli("status", RUN, "--json").stdout)["runs"]
    assert run["counts"]["succeeded"] == farm.videos, run["counts"]
    versions, markers = farm.versions()
    assert not markers, f"objects were deleted: {markers}"
    # The run's result files (results.jsonl, errors.jsonl) are replaced whole by whoever finishes the run: only the
    # videos and their posters (stored after the video, jobs.render.store) are checked for versions here.
    for suffix in (".mp4", ".jpg"):
        keys = sorted(v["Key"] for v in versions if v["Key"].endswith(suffix))
        assert keys == sorted(f"renders/{RUN}/{v['id']}{suffix}" for v in videos), f"one version each expected: {keys}"
    assert {v["Key"] for v in versions if not v["Key"].endswith((".mp4", ".jpg"))} <= {
        f"renders/{RUN}/results.jsonl", f"renders/{RUN}/errors.jsonl"}
    for v in videos:
        assert v["uri"] == f"s3://{farm.bucket}/renders/{RUN}/{v['id']}.mp4"
        body = farm.s3.get_object(Bucket=farm.bucket, Key=f"renders/{RUN}/{v['id']}.mp4")["Body"].read()
        assert len(body) == v["bytes"] and hashlib.sha256(body).hexdigest() == v["sha256"], v["id"]
    with farm.db.connect() as conn:
        costs = dict(conn.execute(select(CostRecord.video_id, func.count()).where(CostRecord.kind == "gpu")
                                  .group_by(CostRecord.video_id)).all())
        video_ids = list(conn.scalars(select(Video.id)))
    assert sorted(costs) == sorted(video_ids) and set(costs.values()) == {1}, f"cost records per video: {costs}"
    return report


@pytest.fixture
def farm(tmp_path, cli_env, postgres_url, redis_server, s3_env) -> Farm:
    return make_farm(tmp_path, cli_env, database_url=postgres_url, broker_url=redis_server, bucket=s3_env,
                     max_attempts=5, retry_backoff_s=1)


def test_sigkill_mid_batch(farm):
    """A worker killed with SIGKILL mid-batch: its lease expires, the other worker renders the batch, once.

    One worker of each pool: solo renders in the worker process, prefork in a child (whose pid is the lease owner);
    either may be the one killed, with its whole process group.
    """
    with Workers(farm.env, farm.cwd) as workers:
        workers.start("solo"), workers.start("prefork")
        assert farm.submit()["pending"] == farm.videos
        victim, held = wait_for("a warm worker holding a batch", lambda: stop_a_holder(farm, workers), 90,
                                diagnose=workers.tails)
        victim.signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        killed_at = datetime.now(timezone.utc)
        wait_done(farm, workers)
        survivor = next(w for w in workers.all if w is not victim)
        assert survivor.alive(), survivor.tail()
        check_exactly_once(farm)
        after = {u.id: u for u in farm.units()}
        with farm.db.connect() as conn:
            recorded = dict(conn.execute(select(CostRecord.video_id, CostRecord.created_at)
                                         .where(CostRecord.kind == "gpu")).all())
        for uid, before in held.items():
            # Claimed again (a new token, another attempt) and recorded after the kill: by the survivor.
            assert after[uid].lease_token > before.lease_token and after[uid].attempts >= 2, (before, after[uid])
            assert recorded[before.video_id] > killed_at
        assert "expired leases" in survivor.text(), survivor.tail()


def test_sigstop_until_the_lease_expires(farm):
    """A worker frozen past its lease: the other takes its batch over; thawed, its late writes change nothing."""
    with Workers(farm.env, farm.cwd) as workers:
        workers.start("solo"), workers.start("prefork")
        farm.submit()

        frozen, held = wait_for("a warm worker holding a batch", lambda: stop_a_holder(farm, workers), 90,
                                diagnose=workers.tails)
        finished_before = frozen.tasks_done()
        wait_done(farm, workers)
        assert frozen.tasks_done() == finished_before, "a frozen worker finished a ticket"
        before = farm.snapshot()
        frozen.signal(signal.SIGCONT)
        # Thawed, it finds its leases lost (or its writes refused) and ends the ticket it held.
        wait_for("the thawed worker to end its ticket", lambda: frozen.tasks_done() > finished_before, 60,
                 diagnose=frozen.tail)
        time.sleep(2 * LEASE_S / 3)  # a renewal and a sweep or two: anything late would have landed by now
        assert frozen.alive(), frozen.tail()
        assert farm.snapshot() == before, "a worker whose lease was taken over changed rows"
        check_exactly_once(farm)
        after = {u.id: u for u in farm.units()}
        for uid, was in held.items():
            assert after[uid].lease_token > was.lease_token and after[uid].attempts >= 2, (was, after[uid])


def test_store_unreachable_for_20_s(tmp_path, cli_env, postgres_url, redis_server, s3_env, s3_server):
    """The S3 endpoint refuses connections (and resets open ones) for 20 s mid-run; the run completes once.

    The outage is a TCP gate in front of moto, not a moto restart: moto keeps objects in memory only, so a restart
    would lose the videos stored before the outage (and the bucket), a loss no real S3 has, and the test could not
    tell reelbatch's faults from the harness's. Freezing moto (SIGSTOP) keeps its memory but only stalls requests in
    the kernel's accept queue, which the worker waits out. Closing the gate is what a store that is down looks like
    to a client: connection refused, open connections reset.
    """
    gate = TcpGate(urlsplit(s3_server.endpoint_url).port)
    try:
        farm = make_farm(tmp_path, cli_env, database_url=postgres_url, broker_url=redis_server, bucket=s3_env,
                         endpoint_url=gate.url, max_attempts=20, retry_backoff_s=1)
        with Workers(farm.env, farm.cwd) as workers:
            workers.start(), workers.start()
            farm.submit()
            wait_for("a unit running on a warm worker", lambda: running_unit(farm, workers), 90,
                     diagnose=workers.tails)
            stored_before = len(farm.versions()[0])
            gate.close()
            down_at = time.monotonic()
            # The batch in flight renders before it stores, on two cores shared with the test and its servers:
            # allow it a minute. The store stays down at least 20 s whenever the failure shows.
            wait_for("a store failure to be recorded", lambda: any(
                "cannot reach the S3 endpoint" in (err or "") for err in _errors(farm)), 60,
                diagnose=lambda: f"unit errors: {_errors(farm)}\n{workers.tails()}")
            time.sleep(max(0.0, 20 - (time.monotonic() - down_at)))
            gate.open()
            up_at = time.monotonic()
            wait_done(farm, workers)
            recovered_s = time.monotonic() - up_at
            check_exactly_once(farm)
        assert stored_before >= 1
        with farm.db.connect() as conn:
            retried = conn.scalar(select(func.count()).select_from(Video).where(Video.attempts >= 2))
        assert retried >= 1
        print(f"store down 20 s: {stored_before} videos stored before, {retried} retried, "
              f"run finished {recovered_s:.1f} s after the store came back")
    finally:
        gate.close()


def _errors(farm: Farm) -> list[str | None]:
    with farm.db.connect() as conn:
        return list(conn.scalars(select(WorkUnit.last_error)))


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test's own, so restarting it disturbs no other test."""
    try:
        service = services.start_postgres()
    except services.MissingBinary as exc:  # as tests/conftest.py does for the shared server
        if os.environ.get("REELBATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{exc} (REELBATCH_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(str(exc))
    try:
        with psycopg.connect(services.libpq_url(service.url), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "faults"')
        yield service
    finally:
        service.stop()


def test_postgres_restart(tmp_path, cli_env, own_postgres, redis_server, s3_env):
    """PostgreSQL restarts twice mid-run (a fast restart, then an outage longer than a lease); the run completes
    and every video succeeded exactly once, within the default 3 attempts (each outage costs a video at most one).
    The second outage needs work still running once a video has succeeded after the first: with 12 videos, all of
    the long shape, a fast CPU had finished the run by then. This run has its 6 small warm-up videos (the first
    success comes from one, so the first restart lands as the long batches start), then 18 of the long shape: three
    rounds of long batches per worker, where the first restart costs at most the first round (it is rendered
    again), a success ends it, and the second outage lands in the second, with the third still to go."""
    url = own_postgres.url.rsplit("/", 1)[0] + "/faults"
    farm = make_farm(tmp_path, cli_env, database_url=url, broker_url=redis_server, bucket=s3_env, retry_backoff_s=1,
                     videos=24)
    with Workers(farm.env, farm.cwd) as workers:
        workers.start(), workers.start()
        farm.submit()
        wait_for("a unit running", lambda: running_unit(farm, workers), 90, diagnose=workers.tails)
        succeeded = farm.counts()["succeeded"]
        own_postgres.restart()  # pg_ctl stop -m fast, then start on the same port and data
        wait_for("a video to succeed after the restart, and a unit running",
                 lambda: farm.counts().get("succeeded", 0) > succeeded and running_unit(farm, workers), 60,
                 diagnose=workers.tails)
        own_postgres.halt()
        time.sleep(LEASE_S + 2)  # every lease expires while the database is away
        own_postgres.start()
        wait_done(farm, workers)
        assert all(w.alive() for w in workers.all), workers.tails()
        check_exactly_once(farm)


def test_frozen_inside_its_lease_renewal(farm):
    """The freeze above, landed at its worst moment: inside the holder's lease-renewal transaction, which has
    locked a unit row (SELECT ... FOR UPDATE in jobs.work.leases.fenced). A VM pause, a debugger, or a network
    partition of the worker catches a transaction open the same way; the server keeps the row lock for as long as
    the client is away, since nothing ends an idle transaction.

    The moment is made certain, not lucky: the test locks the holder's units, waits until the holder's renewal
    queues on that lock, freezes the holder, and lets go; the renewal then takes the lock for a client that
    cannot commit. The promise (jobs/leases.py) is that a frozen worker never holds work for longer than a lease.
    """
    with Workers(farm.env, farm.cwd) as workers:
        workers.start(), workers.start()
        farm.submit()

        def freeze_inside_a_transaction():
            found = rendering_holder(farm, workers)
            if found is None:
                return None
            holder, held = found
            with farm.db.connect() as blocker:
                locked = blocker.execute(select(WorkUnit.id, WorkUnit.video_id, WorkUnit.status, WorkUnit.lease_owner,
                                                WorkUnit.lease_token, WorkUnit.attempts)
                                         .where(WorkUnit.id.in_(list(held))).with_for_update())
                if {u.id: u for u in locked} != held:
                    return None  # it stored its batch before the lock: pick again
                # Its next renewal (or fenced write) waits inside its transaction, behind this lock. Frozen at
                # once, before its other thread can queue too.
                waiters = wait_for("the holder to queue on the row lock", lambda: _lock_waiters(farm), 10,
                                   interval=0.01)
                holder.signal(signal.SIGSTOP)
                blocker.rollback()
            print(f"frozen while waiting for the lock: {waiters}")
            return holder

        wait_for("a worker frozen inside a transaction", freeze_inside_a_transaction, 90, diagnose=workers.tails)
        # For the record (a fix may end that session at once): the frozen client's transaction, holding the lock.
        time.sleep(0.5)
        print(f"sessions after the freeze: {_activity(farm)}")
        # Its lease expires in LEASE_S; once the server ends the frozen transaction (an idle-in-transaction timeout
        # of up to 30 s is fair, twice if its two threads were both queued), the other worker's sweeper reaps the
        # batch within a sweep and renders it.
        wait_done(farm, workers, timeout=LEASE_S + 2 * 30 + 25)
        check_exactly_once(farm)


def _lock_waiters(farm: Farm) -> list:
    with farm.db.connect() as conn:
        return list(conn.exec_driver_sql(
            "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))


def _activity(farm: Farm) -> list:
    with farm.db.connect() as conn:
        return list(conn.exec_driver_sql(
            "SELECT pid, state, wait_event_type, left(query, 200) FROM pg_stat_activity"
            " WHERE datname = current_database()"))


def test_sigkill_between_chunks_resumes_from_the_checkpoint(farm):
    """A long video (9 s of tiny: 3 chunks) whose worker is SIGKILLed while rendering its second chunk: another
    worker takes the chunk over once the lease expires, starting from the first chunk's checkpoint in the store;
    the first chunk never renders again, and the video is whole."""
    manifest = farm.cwd / "long.yaml"
    # 160 steps at 192x192: a chunk renders for a second or more, a window the test's 0.25 s polls cannot miss (at
    # 40 steps of 64x64 a chunk took 0.2 s and a clean-clone run once missed it).
    manifest.write_text(f"name: {RUN}\ndefaults:\n  steps: 160\n  resolution: 192x192\nvideos:\n  - id: long\n"
                        "    prompt: a long one\n"
                        "    duration_s: 9\n")
    farm.cli("submit", str(manifest))

    def chunks() -> dict[int, tuple[str, int]]:
        with farm.db.connect() as conn:
            return {c: (Status(st).value, a) for c, st, a in conn.execute(
                select(WorkUnit.chunk, WorkUnit.status, WorkUnit.attempts).order_by(WorkUnit.chunk))}

    def freeze_on_the_second_chunk(worker):
        """SIGSTOP the worker while chunk 1 is running, then read again: if it moved on between the read and the
        signal, thaw it and ask again (as stop_a_holder does)."""
        seen = chunks()
        if seen.get(0, ("",))[0] != "succeeded" or seen.get(1, ("",))[0] != "running":
            return None
        worker.signal(signal.SIGSTOP)
        if chunks() != seen:
            worker.signal(signal.SIGCONT)
            return None
        return seen

    with Workers(farm.env, farm.cwd) as workers:
        first = workers.start("solo")
        wait_for("the worker frozen on the second chunk", lambda: freeze_on_the_second_chunk(first), 120,
                 diagnose=workers.tails)
        first.signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
        workers.start("solo")
        wait_for("the long video to finish", lambda: farm.counts().get("succeeded") == 1, RUN_TIMEOUT_S,
                 diagnose=lambda: f"chunks {chunks()}\n{workers.tails()}")

        def checkpoints() -> list[str]:
            listing = farm.s3.list_objects_v2(Bucket=farm.bucket, Prefix="renders/_chunks/")
            return [o["Key"] for o in listing.get("Contents", [])]

        # The checkpoints are removed just after the success is recorded (never before: a retry of the last chunk
        # would need them), so the workers keep running until they are gone.
        wait_for("the checkpoints to be removed", lambda: not checkpoints(), 60,
                 diagnose=lambda: f"left: {checkpoints()}\n{workers.tails()}")
    assert chunks() == {0: ("succeeded", 1), 1: ("succeeded", 2), 2: ("succeeded", 1)}
    body = farm.s3.get_object(Bucket=farm.bucket, Key=f"renders/{RUN}/long.mp4")["Body"].read()
    assert probe_mp4(body).frames == 73
