"""Routing in the claim: a worker claims only work of the models it serves, prefers what it has warm by a bounded
amount of rank, keeps a registration's batch limit, and `reelbatch status` names work that no live worker serves.
Against SQLite and a real PostgreSQL (and a real Redis for the tickets)."""

import json
from datetime import timedelta

import numpy as np
from sqlalchemy import select, update
from typer.testing import CliRunner

from engine.types import Shape
from jobs.claims import claims, leases
from jobs.claims.claims import Serving
from jobs.cli import app as cli
from jobs.db import queries, submission
from jobs.db.base import utcnow
from jobs.db.rows import Video, WorkerSession, WorkUnit
from jobs.manifest import load_manifest
from jobs.settings import Settings
from jobs.work.app import create_app
from jobs.work.tickets import send_tickets

TOY = Shape("toy", 32, 32, 9, 20, 2.0)  # the toy model's defaults


def submit(factory, registry, tmp_path, name, model, count, rank, extra=""):
    """A run of `count` videos of `model`, its units given `rank` (the claim order, set by hand)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nmodel: {model}\n{extra}videos:\n"
                    + "".join(f"  - id: {name}{i}\n    prompt: video {i}\n" for i in range(count)))
    run = submission.submit_run(factory, load_manifest(path, registry=registry), output=f"file://{tmp_path}/out/")
    with factory.begin() as s:
        s.execute(update(WorkUnit).where(WorkUnit.video_id.in_(select(Video.id).where(Video.run_id == run.run_id)))
                  .values(rank=rank))
    return run


def keys(claim):
    return [u.key for u in claim.units]


def test_a_worker_claims_only_the_models_it_serves(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, "t", "tiny", 3, rank=2000)  # ranked first, but not served below
    submit(factory, registry, tmp_path, "y", "toy", 2, rank=1000)
    toy_only = Serving(("toy",))
    assert keys(claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=toy_only)) == ["y0", "y1"]
    assert claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=toy_only) is None
    assert claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=Serving(())) is None
    assert not claims.any_claimable(factory, ("toy",)) and claims.any_claimable(factory, ("toy", "tiny"))
    assert claims.next_model(factory, ("toy", "tiny")) == "tiny" and claims.next_model(factory, ("toy",)) is None
    assert claims.claimable_count(factory, ("tiny",)) == 3 and claims.claimable_count(factory, ("toy",)) == 0
    assert keys(claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=Serving(("toy", "tiny")))) \
        == ["t0", "t1", "t2"]


def test_a_loaded_models_work_counts_affinity_s_seconds_more(factory, registry, tmp_path):
    # tiny waited 500 s longer than toy (rank 1,000,000 against 999,500): a worker with toy loaded and an affinity
    # of 600 s takes toy (999,500 + 600 = 1,000,100 > 1,000,000); without the preference, tiny.
    submit(factory, registry, tmp_path, "t", "tiny", 1, rank=1_000_000)
    submit(factory, registry, tmp_path, "y", "toy", 1, rank=999_500)
    both = ("tiny", "toy")
    cold = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60,
                              serving=Serving(both, loaded=("toy",), affinity_s=0))
    assert keys(cold) == ["t0"]
    warm = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60,
                              serving=Serving(both, loaded=("toy",), affinity_s=600))
    assert keys(warm) == ["y0"]


def test_work_that_waited_longer_than_the_preference_goes_first(factory, registry, tmp_path):
    # tiny waited 700 s longer: 999,300 + 600 = 999,900 < 1,000,000, so the warm worker takes tiny all the same.
    submit(factory, registry, tmp_path, "t", "tiny", 1, rank=1_000_000)
    submit(factory, registry, tmp_path, "y", "toy", 1, rank=999_300)
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60,
                               serving=Serving(("tiny", "toy"), loaded=("toy",), affinity_s=600))
    assert keys(claim) == ["t0"]


def test_the_last_batchs_shape_counts_as_much_again(factory, registry, tmp_path):
    # Two toy shapes (20 and 10 steps). The 10-step work ranks 500 s lower; as the last batch's shape it gains
    # 2 x 600 against the other's 600: 999,500 + 1,200 = 1,000,700 > 1,000,000 + 600.
    submit(factory, registry, tmp_path, "a", "toy", 1, rank=1_000_000)
    submit(factory, registry, tmp_path, "b", "toy", 1, rank=999_500, extra="defaults:\n  steps: 10\n")
    last = Shape("toy", 32, 32, 9, 10, 2.0)
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60,
                               serving=Serving(("toy",), loaded=("toy",), shape=last, affinity_s=600))
    assert keys(claim) == ["b0"] and claim.batch.shape == last


def test_without_the_last_shape_rank_decides_between_shapes_of_a_loaded_model(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, "a", "toy", 1, rank=1_000_000)
    submit(factory, registry, tmp_path, "b", "toy", 1, rank=999_500, extra="defaults:\n  steps: 10\n")
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60,
                               serving=Serving(("toy",), loaded=("toy",), shape=TOY, affinity_s=600))
    assert keys(claim) == ["a0"]


def test_a_registrations_max_batch_caps_the_workers(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, "t", "tiny", 7, rank=0)
    small = Serving(("tiny",), max_batch={"tiny": 2})
    assert keys(claims.claim_batch(factory, owner="w", max_batch=4, lease_s=60, serving=small)) == ["t0", "t1"]
    large = Serving(("tiny",), max_batch={"tiny": 8})  # the worker's own 4 is smaller
    assert keys(claims.claim_batch(factory, owner="w", max_batch=4, lease_s=60, serving=large)) \
        == ["t2", "t3", "t4", "t5"]


def test_reaped_units_are_counted_by_model(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, "t", "tiny", 2, rank=10)
    submit(factory, registry, tmp_path, "y", "toy", 1, rank=0)
    for _ in range(2):
        claims.claim_batch(factory, owner="dead", max_batch=8, lease_s=0.01)
    with factory.begin() as s:
        s.execute(update(WorkUnit).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    assert leases.reap_expired(factory, max_attempts=3) == {"tiny": 2, "toy": 1}


def add_session(factory, models, *, seen_s_ago=0.0, ended=False):
    with factory.begin() as s:
        s.add(WorkerSession(owner="host:1", up_s=1.0, rate_usd_per_hour=1.0, rate_source="test", models=models,
                            last_seen_at=utcnow() - timedelta(seconds=seen_s_ago),
                            ended_at=utcnow() if ended else None))


def test_status_names_pending_work_that_no_live_worker_serves(factory, db_url, registry, tmp_path):
    submit(factory, registry, tmp_path, "t", "tiny", 3, rank=0)
    submit(factory, registry, tmp_path, "y", "toy", 2, rank=0)
    add_session(factory, "tiny")
    add_session(factory, "toy", seen_s_ago=3601)  # silent for more than three leases (3 x 120 s): not live
    add_session(factory, "toy", ended=True)
    env = {"REELBATCH_DATABASE_URL": db_url}
    runner = CliRunner()
    text = runner.invoke(cli, ["status"], env=env)
    assert text.exit_code == 0 and "2 pending: no live worker serves toy" in text.output, text.output
    assert "serves tiny" not in text.output
    assert json.loads(runner.invoke(cli, ["status", "--json"], env=env).output)["unserved"] == {"toy": 2}
    assert json.loads(runner.invoke(cli, ["status", "t", "--json"], env=env).output)["unserved"] == {}
    add_session(factory, "tiny,toy")
    assert json.loads(runner.invoke(cli, ["status", "--json"], env=env).output)["unserved"] == {}


def test_a_session_opened_before_models_were_recorded_serves_every_model(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, "y", "toy", 2, rank=0)
    assert queries.unserved_pending(factory, 360) == {"toy": 2}
    add_session(factory, None)
    assert queries.unserved_pending(factory, 360) == {}


def test_tickets_go_to_their_models_queue(redis_server):
    import redis

    settings = Settings.from_env({"REELBATCH_BROKER_URL": redis_server, "REELBATCH_QUEUE": "routing-test"})
    app = create_app(settings)
    assert send_tickets(app, 3, "toy") == 3 and send_tickets(app, 2, "wan-14b") == 2 and send_tickets(app, 1) == 1
    server = redis.Redis.from_url(redis_server)
    assert [server.llen(q) for q in ("routing-test.model.toy", "routing-test.model.wan-14b", "routing-test")] \
        == [3, 2, 1]
    server.delete("routing-test.model.toy", "routing-test.model.wan-14b", "routing-test")


def test_a_worker_without_a_models_gate_leaves_its_work_and_status_says_why(factory, db_url, registry, tmp_path):
    """toy-fast is distilled: a worker whose cache holds no passing gate for it serves the rest and claims none of
    its work (jobs.render.serving.serving), its session marks it ungated, and `status` names the missing gate. Once a
    passing record of 32 videos exists for its files, the same worker's next claim takes it."""
    from engine.engine import Engine
    from engine.levers import gates
    from jobs.render.serving import gated_models, serving

    submit(factory, registry, tmp_path, "f", "toy-fast", 2, rank=0)
    settings = Settings.from_env({"REELBATCH_CACHE_DIR": str(tmp_path / "cache"),
                                  "REELBATCH_WORKER_MODELS": "toy,toy-fast"})
    engine = Engine(settings.engine_config(), registry)
    assert gated_models(engine, ("toy", "toy-fast")) == (("toy",), ("toy-fast",))
    assert claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=serving(settings, engine)) is None

    add_session(factory, "toy,!toy-fast")  # what such a worker's session records (jobs.work.process.meter)
    runner, env = CliRunner(), {"REELBATCH_DATABASE_URL": db_url}
    text = runner.invoke(cli, ["status"], env=env)
    assert "2 pending: unserved: no gate for toy-fast on any worker" in " ".join(text.output.split()), text.output
    status = json.loads(runner.invoke(cli, ["status", "--json"], env=env).output)
    assert (status["unserved"], status["ungated"]) == ({"toy-fast": 2}, ["toy-fast"])

    video = [np.arange(192, dtype=np.uint8).reshape(1, 8, 8, 3).repeat(2, axis=0)] * gates.MIN_SAMPLE
    same = {"colour": 1.0, "shape": 0.8, "direction": 0.95, "background": 1.0}
    gates.record(settings.engine.cache_dir, gates.distilled_gate(
        "toy-fast", engine.gate_identity(registry.get("toy-fast")), "toy", adherence=same, teacher_adherence=same,
        videos=video, teacher_videos=video, batch=8, speedup=8.0))
    # The record is read at each claim: no restart.
    assert keys(claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60,
                                   serving=serving(settings, engine))) == ["f0", "f1"]


def test_a_warm_shape_counts_as_the_last_one_does(factory, registry, tmp_path):
    # As above, but the 10-step shape was warmed up (or rendered earlier) and the last batch was a third shape
    # (5 steps, nothing waiting): 999,500 + 2 x 600 = 1,000,700 > 1,000,000 + 600.
    submit(factory, registry, tmp_path, "a", "toy", 1, rank=1_000_000)
    submit(factory, registry, tmp_path, "b", "toy", 1, rank=999_500, extra="defaults:\n  steps: 10\n")
    warm = Shape("toy", 32, 32, 9, 10, 2.0)
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60,
                               serving=Serving(("toy",), loaded=("toy",), shape=Shape("toy", 32, 32, 9, 5, 2.0),
                                               affinity_s=600, warm=(warm,)))
    assert keys(claim) == ["b0"] and claim.batch.shape == warm
