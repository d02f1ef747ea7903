"""The fault tests' farm (tests/e2e/test_faults.py, test_preempt.py): a run of `reelbatch` videos on PostgreSQL,
Redis and moto with short leases, the worker processes' states read from its rows, and the one check every fault
test ends with (`check_exactly_once`)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

import boto3
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from jobs.db.connect import upgrade
from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.status import Status

from .conftest import Cli
from .procs import Workers, wait_for

# Short leases so a dead worker's batch comes back within seconds; the sweeper then runs every 1.25 s
# (jobs.work.sweeper: lease_s / 4, at least 1 s) and a holder renews every 1.7 s (jobs.render.batch.LeaseKeeper: lease_s
# / 3).
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


def wait_done(farm: Farm, workers: Workers, timeout: float | None = None) -> None:
    """Every video finished, within RUN_TIMEOUT_S per 12 videos unless `timeout` says otherwise (test_postgres_restart
    runs 24: at 120 s it timed out with 18 succeeded and 6 running, each batch of 3 taking 48 s on a machine other
    jobs kept at load 10)."""
    if timeout is None:
        timeout = RUN_TIMEOUT_S * max(1.0, farm.videos / VIDEOS)
    wait_for("every video to finish", farm.done, timeout,
             diagnose=lambda: f"counts {farm.counts()}\nunits {farm.units()}\nsessions {activity(farm)}\n"
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


def unit_errors(farm: Farm) -> list[str | None]:
    with farm.db.connect() as conn:
        return list(conn.scalars(select(WorkUnit.last_error)))


def lock_waiters(farm: Farm) -> list:
    with farm.db.connect() as conn:
        return list(conn.exec_driver_sql(
            "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))


def activity(farm: Farm) -> list:
    with farm.db.connect() as conn:
        return list(conn.exec_driver_sql(
            "SELECT pid, state, wait_event_type, left(query, 200) FROM pg_stat_activity"
            " WHERE datname = current_database()"))
