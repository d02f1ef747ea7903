"""One batch through the real path: claim -> tiny engine -> PyAV -> store -> rows, with no Celery in between."""

import json
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from engine.engine import Engine
from jobs.claims import claims, leases
from jobs.db import queries, submission
from jobs.db.base import utcnow
from jobs.db.connect import session_factory
from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.status import Status
from jobs.manifest import keys, load_manifest
from jobs.render import encoding
from jobs.render.batch import Finisher, render_next_batch
from jobs.settings import Settings
from storage.encode import probe_mp4


@pytest.fixture
def setup(tmp_path, model_cache, registry):
    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 'r.db'}",
                                                  "engine.cache_dir": model_cache, "worker.max_batch": 8,
                                                  "prices.gpu.usd_per_hour": 3.6})
    factory = session_factory(settings.database_url)
    manifest = tmp_path / "r.yaml"
    manifest.write_text("name: r\ndefaults: {steps: 2}\nvideos:\n"
                        + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(3)))
    spec = load_manifest(manifest, registry=registry)
    submission.submit_run(factory, spec, output=f"file://{tmp_path / 'out'}/")
    return settings, factory, Engine(settings.engine_config(), registry), tmp_path / "out" / "r"


def test_a_batch_renders_encodes_stores_and_costs(setup):
    settings, factory, engine, folder = setup
    settings = settings.with_values({"worker.store_threads": 1})  # one video after another: nothing overlaps
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded, result.failed) == (3, 3, 0)
    assert render_next_batch(settings, engine, factory).claimed == 0, "nothing left to claim"
    with factory() as s:
        videos = list(s.scalars(select(Video).order_by(Video.id)))
        costs = {c.video_id: c for c in s.scalars(select(CostRecord).where(CostRecord.kind == "gpu"))}
        storage = {c.video_id: c for c in s.scalars(select(CostRecord).where(CostRecord.kind == "storage"))}
    for v in videos:
        assert Status(v.status) is Status.SUCCEEDED and v.attempts == 1
        info = probe_mp4(folder / f"{v.key}.mp4")
        assert (info.frames, info.width, info.height, info.fps) == (9, 64, 64, 8)
        cost = costs[v.id]
        # Without the finisher nothing overlaps: its render share, encode and upload, and the bookkeeping between.
        assert v.render_s + v.encode_s + v.upload_s <= cost.seconds < v.render_s + v.encode_s + v.upload_s + 0.5
        assert (cost.rate_usd_per_hour, cost.amount_micro_usd > 0) == (3.6, True)  # the sum: tests/jobs/test_prices.py
        # Keeping it: its bytes at the default $0.023 per GB-month for one month (egress is off by default).
        assert storage[v.id].amount_micro_usd == round(v.bytes / 1e9 * 0.023 * 1e6)
        assert "$0.023/GB-month x 1 months" in storage[v.id].rate_source
    # Same shape: the batch's render time is shared equally, and so is each of its stages.
    assert len({round(v.render_s, 9) for v in videos}) == 1
    for v in videos:
        assert v.denoise_s > 0 and v.decode_s > 0 and v.text_s >= 0
        # render_s also holds the first batch's model load.
        assert v.text_s + v.denoise_s + v.decode_s <= v.render_s


def test_a_finisher_stores_while_the_next_batch_renders(setup):
    """With a Finisher, render_next_batch returns once the batch is rendered; its videos stay leased (renewed)
    until the finisher has stored and recorded them, with the same MP4s the synchronous path writes."""
    settings, factory, engine, folder = setup
    settings = settings.with_values({"worker.max_batch": 2, "limits.lease_s": 0.6})
    finisher = Finisher()
    first = render_next_batch(settings, engine, factory, finisher)
    assert (first.claimed, first.succeeded, first.pending) == (2, 0, 2)
    # The first batch's leases outlive their 0.6 s while it waits (the keeper renews them), so no one can steal it.
    time.sleep(1.5)
    second = render_next_batch(settings, engine, factory, finisher)
    assert (second.claimed, second.pending) == (1, 1), "only the third video was claimable"
    done = finisher.wait()
    assert (done.claimed, done.succeeded) == (1, 1)
    with factory() as s:
        videos = list(s.scalars(select(Video).order_by(Video.id)))
    assert [Status(v.status) for v in videos] == [Status.SUCCEEDED] * 3
    assert all(v.attempts == 1 for v in videos), "no lease expired and no video rendered twice"
    assert probe_mp4(folder / "v2.mp4").frames == 9


def test_a_batch_stores_its_videos_on_several_threads_and_charges_their_overlap_once(setup, monkeypatch):
    settings, factory, engine, folder = setup
    # `auto` stores one after another on a CPU (the next batch renders on the same cores) and 4 at once on a GPU.
    assert (settings.worker.store_threads, encoding.store_threads(settings, engine)) == (0, 1)
    settings = settings.with_values({"worker.store_threads": 4})
    assert encoding.store_threads(settings, engine) == 4
    # Each MP4's upload waits until all three are uploading: stored one after another, the first would wait alone
    # for 20 s, fail, and be retried.
    meeting = threading.Barrier(3, timeout=20)
    real_store_for = keys.store_for

    class Meeting:
        def __init__(self, store):
            self.store = store

        def __getattr__(self, name):
            return getattr(self.store, name)

        def put(self, key, data, **kwargs):
            if key.endswith(".mp4"):
                meeting.wait()
            return self.store.put(key, data, **kwargs)

    monkeypatch.setattr(keys, "store_for", lambda prefix: Meeting(real_store_for(prefix)))
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded, result.retried, result.failed) == (3, 3, 0, 0)
    with factory() as s:
        videos = list(s.scalars(select(Video).order_by(Video.id)))
        charged = {c.video_id: c.seconds for c in s.scalars(select(CostRecord).where(CostRecord.kind == "gpu"))}
    assert [v.attempts for v in videos] == [1, 1, 1]
    for v in videos:
        assert probe_mp4(folder / f"{v.key}.mp4").frames == 9
    # Every upload waited for the others, so the three storing times overlap: charged once, the batch's storing
    # seconds are less than the sum of each video's own encode and upload.
    storing = sum(charged[v.id] - v.render_s for v in videos)
    assert 0 < storing < sum(v.encode_s + v.upload_s for v in videos)


def test_an_existing_different_object_is_never_overwritten(setup):
    settings, factory, engine, folder = setup
    folder.mkdir(parents=True)
    (folder / "v1.mp4").write_bytes(b"somebody else's video")
    result = render_next_batch(settings, engine, factory)
    assert (result.succeeded, result.failed) == (2, 1), "one bad video must not fail its neighbours"
    assert (folder / "v1.mp4").read_bytes() == b"somebody else's video"
    with factory() as s:
        v1 = s.scalar(select(Video).where(Video.key == "v1"))
        # No output and no storage charge; the render it took is charged as its failed attempt (the run's total).
        kinds = list(s.scalars(select(CostRecord.kind).where(CostRecord.video_id == v1.id)))
    assert kinds == ["retry"]
    assert Status(v1.status) is Status.FAILED
    assert "ObjectConflict" in v1.last_error and "v1.mp4" in v1.last_error
    # Every video is done, so the worker wrote the run's result files beside the videos, OpenAI Batch style.
    results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in results] == [("v0", "succeeded"), ("v1", "failed"), ("v2", "succeeded")]
    ok = results[0]
    assert ok["uri"] == (folder / "v0.mp4").as_uri() and len(ok["sha256"]) == 64 and ok["cost_usd"] > 0
    assert (ok["frames"], ok["fps"], ok["chunks"]) == (9, 8, 1) and ok["timings"]["render_s"] > 0
    (error,) = [json.loads(line) for line in (folder / "errors.jsonl").read_text().splitlines()]
    assert error["id"] == "v1" and error["code"] == "ObjectConflict" and "v1.mp4" in error["message"]


def test_compile_ahead_warms_the_waiting_shape_so_the_first_batch_compiles_nothing(setup, monkeypatch, tmp_path):
    """warm_up compiles each waiting shape at the batch size a claim will take; the real batch then runs the
    compiled code without a new graph (torch._dynamo's own count)."""
    from torch._dynamo.utils import counters

    from jobs.render.serving import warm_up

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    settings, factory, _, _ = setup
    settings = settings.with_values({"engine.compile": True})
    engine = Engine(settings.engine_config(), setup[2].registry)
    assert warm_up(settings, engine, factory) == ["tiny|64x64|f9|s2|g5"]
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0, "the warm-up compiled"
    with factory() as s:
        assert {Status(v.status) for v in s.scalars(select(Video))} == {Status.PENDING}, "a warm-up claims nothing"
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded) == (3, 3)
    assert counters["stats"]["unique_graphs"] == graphs, "the first real batch compiled again"


def test_a_failed_attempt_is_charged_to_the_video_that_needed_it(setup):
    """The store refuses every video (a file sits where the run's folder goes: "File exists", which another
    attempt would meet again, so each video fails in its one attempt: tests/jobs/test_decisions.py has the kinds of
    failure): each video's render share is charged as a "retry" cost record. The report's per-video cost and total
    are the sums of those records, to the micro-dollar. (A retried attempt then a stored one: test_decisions.py,
    the store outage.)"""
    from jobs.reports.summary import report_dict

    settings, factory, engine, folder = setup
    folder.parent.mkdir(parents=True)
    folder.write_bytes(b"not a folder")
    first = render_next_batch(settings, engine, factory)
    assert (first.claimed, first.succeeded, first.retried, first.failed) == (3, 0, 0, 3)
    with factory() as s:
        records = list(s.scalars(select(CostRecord).order_by(CostRecord.id)))
        errors = set(s.scalars(select(Video.last_error)))
    assert errors == {f"StoreError: {(folder / name).as_uri()}: File exists" for name in ("v0.mp4", "v1.mp4",
                                                                                         "v2.mp4")}, errors
    run_row, videos = queries.load_report(factory, "r")
    kinds = {}
    for r in records:
        kinds.setdefault(r.video_id, []).append(r.kind)
        assert r.amount_micro_usd == round(r.seconds * 3.6 / 3600 * 1e6)
    assert sorted(kinds.values()) == [["retry"]] * 3
    retry = [r for r in records if r.kind == "retry"]
    # An equal share of the batch's render, plus its own encode and failed store, which differ by milliseconds.
    seconds = [r.seconds for r in retry]
    assert min(seconds) > 0 and max(seconds) - min(seconds) < 0.5
    report = report_dict(run_row, videos)
    assert report["cost"]["total_usd"] * 1e6 == pytest.approx(sum(r.amount_micro_usd for r in records))
    for row in report["videos"]:
        vid = next(v.id for v, _ in videos if v.key == row["id"])
        assert row["cost_usd"] * 1e6 == pytest.approx(sum(r.amount_micro_usd for r in records if r.video_id == vid))


def test_a_batch_shows_in_the_prometheus_metrics(setup):
    """The counters a worker serves move with what the batch did, and the endpoint answers over HTTP."""
    import urllib.request

    from prometheus_client import REGISTRY

    from jobs.observe import prometheus as metrics
    from tests.services import free_port

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    settings, factory, engine, _ = setup
    before = {"ok": value("reelbatch_videos_total", outcome="succeeded"), "gpu": value("reelbatch_gpu_seconds_total"),
              "batches": value("reelbatch_batch_size_count"), "denoise": value("reelbatch_stage_seconds_count",
                                                                              stage="denoise")}
    assert render_next_batch(settings, engine, factory).succeeded == 3
    assert value("reelbatch_videos_total", outcome="succeeded") == before["ok"] + 3
    assert value("reelbatch_batch_size_count") == before["batches"] + 1
    assert value("reelbatch_stage_seconds_count", stage="denoise") == before["denoise"] + 3
    with factory() as s:
        charged = sum(c.seconds for c in s.scalars(select(CostRecord).where(CostRecord.kind == "gpu")))
    assert value("reelbatch_gpu_seconds_total") - before["gpu"] == pytest.approx(charged)
    port = metrics.serve(free_port())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'reelbatch_videos_total{outcome="succeeded"}' in text and "reelbatch_queue_depth" in text


def test_a_video_whose_lease_was_lost_before_its_upload_is_left_to_its_new_holder(setup):
    """The worker renders; before it stores, v1's lease expires, the reaper hands v1 on and another worker claims
    it (a worker frozen past its lease, made to happen every time). This worker stores and records v0 and v2 and
    writes nothing for v1: no object, no cost record, no change to the row the other worker now holds."""
    settings, factory, engine, folder = setup
    render = engine.render

    def then_lose_v1(*args, **kwargs):
        rendered = render(*args, **kwargs)
        with factory.begin() as s:
            unit = s.scalar(select(WorkUnit).join(Video).where(Video.key == "v1"))
            unit.lease_expires_at = utcnow() - timedelta(seconds=1)
        assert leases.reap_expired(factory, max_attempts=3) == {"tiny": 1}
        other = claims.claim_batch(factory, owner="other-worker", max_batch=8, lease_s=600)
        assert [u.key for u in other.units] == ["v1"]
        return rendered

    engine.render = then_lose_v1
    result = render_next_batch(settings, engine, factory)  # lease_s 120: the keeper renews nothing meanwhile
    assert (result.claimed, result.succeeded, result.retried, result.failed) == (3, 2, 0, 0)
    assert sorted(p.name for p in folder.iterdir()) == ["v0.jpg", "v0.mp4", "v2.jpg", "v2.mp4"]
    with factory() as s:
        v1 = s.scalar(select(Video).where(Video.key == "v1"))
        unit = s.scalar(select(WorkUnit).where(WorkUnit.video_id == v1.id))
        kinds = list(s.scalars(select(CostRecord.kind).where(CostRecord.video_id == v1.id)))
    assert Status(v1.status) is Status.RUNNING and unit.lease_owner == "other-worker" and v1.upload_sha256 is None
    assert v1.attempts == 2 and kinds == [], "the lost attempt is the reaper's to count, and nobody's to charge"


def test_a_batch_whose_checksums_cannot_be_recorded_uploads_nothing_and_retries_each_video(setup, monkeypatch):
    """A batch's checksums are recorded in one transaction before any upload (jobs.render.record.mark_all_uploading).
    When that transaction fails (the database gone for the moment), nothing is uploaded, each video is retried and
    charged its attempt, and the next attempt stores all three."""
    from jobs.render import record

    settings, factory, engine, folder = setup
    settings = settings.with_values({"limits.retry_backoff_s": 0.01})

    def unreachable(*args, **kwargs):
        raise ConnectionError("the database went away")

    monkeypatch.setattr(record, "mark_all_uploading", unreachable)
    first = render_next_batch(settings, engine, factory)
    assert (first.claimed, first.succeeded, first.retried, first.failed) == (3, 0, 3, 0)
    assert not folder.exists() or list(folder.iterdir()) == [], "no MP4 or poster without its recorded checksum"
    with factory() as s:
        errors = [v.last_error for v in s.scalars(select(Video).order_by(Video.id))]
        kinds = sorted(s.scalars(select(CostRecord.kind)))
    assert errors == ["ConnectionError: the database went away"] * 3 and kinds == ["retry"] * 3
    monkeypatch.undo()
    time.sleep(0.05)
    assert render_next_batch(settings, engine, factory).succeeded == 3
    stored = sorted(p.name for p in folder.iterdir() if p.suffix in (".mp4", ".jpg"))
    assert stored == ["v0.jpg", "v0.mp4", "v1.jpg", "v1.mp4", "v2.jpg", "v2.mp4"]
