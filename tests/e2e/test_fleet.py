"""A fleet of unlike machines: real `reelbatch worker` processes with different models files share one PostgreSQL
and one Redis. Each renders only the models it serves, tickets wake only workers that serve their model, and work
for a model no live worker serves waits (and `reelbatch status` says so) instead of failing.

The models are the toy model's weights registered under other names, so each renders a 32x32 clip in a second.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from sqlalchemy import create_engine, select
from sqlalchemy.pool import NullPool

from engine.models.registry import TOY, TOY_WEIGHTS
from jobs.db.rows import CostRecord, Run, Video, WorkerSession
from jobs.db.status import Status

from .conftest import Cli
from .procs import Workers, wait_for

VIDEOS = 6  # per served model: two batches of three each


def models_file(path: Path, *names: str) -> Path:
    d = TOY.defaults
    path.write_text("".join(
        f"{name}:\n  path: {TOY_WEIGHTS}\n"
        f"  defaults: {{width: {d.width}, height: {d.height}, fps: {d.fps}, duration_s: {d.duration_s}, "
        f"steps: {d.steps}, guidance: {d.guidance}}}\n"
        f"  temporal_factor: {TOY.temporal_factor}\n  max_frames: {TOY.max_frames}\n"
        f"  max_sequence_length: {TOY.max_sequence_length}\n  chunk_condition: {TOY.chunk_condition}\n"
        for name in names))
    return path


def manifest(path: Path, name: str, model: str, count: int) -> Path:
    path.write_text(f"name: {name}\nmodel: {model}\nvideos:\n" + "".join(
        f"  - id: {name}-{i}\n    prompt: a red circle moving left on a black background\n    seed: {i}\n"
        for i in range(count)))
    return path


def test_a_mixed_fleet_renders_each_model_on_a_worker_that_serves_it(tmp_path, cli_env, postgres_url, redis_server):
    env = {**cli_env, "REELBATCH_DATABASE_URL": postgres_url, "REELBATCH_BROKER_URL": redis_server,
           "REELBATCH_OUTPUT": f"file://{tmp_path}/out/", "REELBATCH_QUEUE": f"fleet-{uuid.uuid4().hex[:8]}",
           "REELBATCH_MAX_BATCH": "3", "REELBATCH_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
           # The submitter knows every model; each worker only its own file's.
           "REELBATCH_MODELS": str(models_file(tmp_path / "all.yaml", "alpha", "beta", "gamma"))}
    cli = Cli(tmp_path, env)
    cli("db", "upgrade")
    db = create_engine(postgres_url, poolclass=NullPool)
    with Workers(env, tmp_path) as workers:
        # A: its models file registers alpha; it serves alpha and the built-ins. B: beta's file, narrowed to beta.
        a = workers.start(env={"REELBATCH_MODELS": str(models_file(tmp_path / "a.yaml", "alpha"))})
        b = workers.start(args=("--models", "beta"),
                          env={"REELBATCH_MODELS": str(models_file(tmp_path / "b.yaml", "beta"))})
        for name, model, count in [("mix-alpha", "alpha", VIDEOS), ("mix-beta", "beta", VIDEOS),
                                   ("mix-gamma", "gamma", 2)]:
            cli("submit", str(manifest(tmp_path / f"{name}.yaml", name, model, count)))

        def by_model() -> dict[str, dict[str, int]]:
            with db.connect() as conn:
                rows = conn.execute(select(Run.model, Video.status)
                                    .join(Video, Video.run_id == Run.id)).all()
            out: dict[str, dict[str, int]] = {}
            for model, status in rows:
                out.setdefault(model, {}).setdefault(Status(status).value, 0)
                out[model][Status(status).value] += 1
            return out

        wait_for("alpha and beta to finish", lambda: by_model().get("alpha") == {"succeeded": VIDEOS}
                 and by_model().get("beta") == {"succeeded": VIDEOS}, 300,
                 diagnose=lambda: f"{by_model()}\n{workers.tails()}")
        assert a.alive() and b.alive(), workers.tails()

        with db.connect() as conn:
            sessions = {owner: models for owner, models in conn.execute(
                select(WorkerSession.owner, WorkerSession.models).where(WorkerSession.ended_at.is_(None)))}
            rendered = conn.execute(select(Run.model, Video.key, Video.attempts, WorkerSession.owner)
                                    .join(Video, Video.run_id == Run.id)
                                    .join(CostRecord, (CostRecord.video_id == Video.id) & (CostRecord.kind == "gpu"))
                                    .join(WorkerSession, WorkerSession.id == CostRecord.session_id)).all()
        # toy-fast is distilled and this worker's cache holds no gate for it: served by none, marked ungated.
        assert sorted(sessions.values()) == ["alpha,tiny,tiny-i2v,toy,toy-i2v,!toy-fast", "beta"], sessions
        # Each video rendered once (one attempt, one charge), by a worker that serves its model.
        assert sorted(key for _, key, _, _ in rendered) == sorted(
            [f"mix-alpha-{i}" for i in range(VIDEOS)] + [f"mix-beta-{i}" for i in range(VIDEOS)])
        for model, key, attempts, owner in rendered:
            assert attempts == 1, (key, attempts)
            assert (a if model == "alpha" else b).owns(owner), (key, owner)

        # gamma: served by no live worker, so it waits, untouched, and status says why.
        assert by_model()["gamma"] == {"pending": 2}
        with db.connect() as conn:
            assert set(conn.scalars(select(Video.attempts).join(Run).where(Run.model == "gamma"))) == {0}
        assert "2 pending: no live worker serves gamma" in " ".join(cli("status").stdout.split())
        assert json.loads(cli("status", "--json").stdout)["unserved"] == {"gamma": 2}
        assert not [f for f in os.listdir(tmp_path / "out") if f.startswith("mix-gamma")]
