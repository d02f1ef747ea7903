"""Errors decide retries (jobs.render.attempts.decide): one test per kind of failure, through the real path (claim ->
tiny engine -> PyAV -> a store -> rows). A failure another attempt would meet again fails its video in one attempt,
with its reason; one that may pass is retried. Attempt counts, statuses and messages worked out by hand."""

from urllib.parse import urlsplit

import pytest
import torch
from sqlalchemy import select

from engine.adapters import light_decoder
from engine.engine import Engine
from engine.errors import ModelNotFound, RenderError, RenderInterrupted, RetryableRenderError
from engine.levers.gates import UngatedSetting
from engine.models.file import load_registry
from engine.models.tiny import ensure_tiny
from faults import Decision
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import CostRecord, Video
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.render.attempts import decide
from jobs.render.batch import render_next_batch
from jobs.settings import Settings
from storage.stores import (
    IntegrityError,
    KeyTooLong,
    ObjectConflict,
    ObjectNotFound,
    ObjectTooLarge,
    StoreError,
    StoreUnavailable,
)
from tests.e2e.procs import TcpGate


def submit(tmp_path, model_cache, registry, videos: str, output: str, model: str = "tiny", settings=None):
    """Run `r` of `model` (2 steps) of `videos` (YAML list items), submitted to SQLite for `output`; 3 attempts a
    video."""
    manifest = tmp_path / "r.yaml"
    manifest.write_text(f"name: r\nmodel: {model}\ndefaults: {{steps: 2, resolution: 64x64, fps: 8, duration_s: 1}}\n"
                        f"videos:\n{videos}")
    config = Settings.from_env({}).with_values({
        "database_url": f"sqlite:///{tmp_path / 'r.db'}", "engine.cache_dir": model_cache, "worker.max_batch": 8,
        "limits.max_attempts": 3, "limits.retry_backoff_s": 0.01, **(settings or {})})
    factory = session_factory(config.database_url)
    submission.submit_run(factory, load_manifest(manifest, registry=registry), output=output)
    return config, factory, Engine(config.engine_config(), registry)


def videos(factory) -> dict[str, Video]:
    with factory() as s:
        return {v.key: v for v in s.scalars(select(Video))}


def charges(factory) -> dict[str, list[str]]:
    with factory() as s:
        rows = s.execute(select(Video.key, CostRecord.kind).join(CostRecord, CostRecord.video_id == Video.id)
                         .order_by(CostRecord.id)).all()
    found: dict[str, list[str]] = {}
    for key, kind in rows:
        found.setdefault(key, []).append(kind)
    return found


def test_every_error_class_carries_its_decision_and_anything_else_is_retried():
    permanent = [RenderError("x"), UngatedSetting("x", "step_cache=0.1"), ModelNotFound("x"), ObjectConflict("x"),
                 KeyTooLong("x"), ObjectNotFound("x"), ObjectTooLarge("x"), StoreError("no such bucket")]
    assert {type(e).__name__: decide(e) for e in permanent} == {type(e).__name__: Decision.FAIL_NOW
                                                                for e in permanent}
    passing = [RetryableRenderError("x"), StoreUnavailable("x"), IntegrityError("x"),
               RuntimeError("a bug"), ConnectionError("the database restarting")]
    assert [decide(e) for e in passing] == [Decision.RETRY] * 5
    assert decide(RenderInterrupted("cancelled")) is Decision.HAND_BACK


def test_a_decoder_that_gives_flat_frames_fails_each_video_in_one_attempt(tmp_path, model_cache):
    """A registration whose light decoder has every weight zero decodes any latents to 0, which the pipeline's
    postprocess maps to 0.5 and then 127.5, rounded half to even: 128 in every pixel. The engine refuses blank
    frames, and the same model, prompt and seed would give them again, so both videos fail in their one attempt
    (before: each rendered three times for the same message)."""
    with torch.random.fork_rng(devices=[]):
        decoder = light_decoder.LightDecoder(light_decoder.DecoderConfig(16, 8, 4, (16, 8, 8, 8)))
    with torch.no_grad():
        for p in decoder.parameters():
            p.zero_()
    light_decoder.save(decoder, tmp_path / "flat-decoder")
    models = tmp_path / "models.yaml"
    models.write_text(f"flat:\n  path: {ensure_tiny(model_cache)}\n  decoder: {tmp_path / 'flat-decoder'}\n")
    registry = load_registry(models)
    settings, factory, engine = submit(tmp_path, model_cache, registry,
                                       "  - {id: v0, prompt: a red circle}\n  - {id: v1, prompt: a blue square}\n",
                                       f"file://{tmp_path / 'out'}/", model="flat")
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded, result.retried, result.failed) == (2, 0, 0, 2)
    assert render_next_batch(settings, engine, factory).claimed == 0, "nothing was put back to render again"
    for v in videos(factory).values():
        assert (Status(v.status), v.attempts) == (Status.FAILED, 1)
        assert v.last_error == "RenderError: render produced blank frames (every pixel 128)"
    # The render was spent all the same: each video is charged its share, as a failed attempt ("retry").
    assert charges(factory) == {"v0": ["retry"], "v1": ["retry"]}
    assert sorted(p.name for p in (tmp_path / "out" / "r").iterdir()) == ["errors.jsonl", "results.jsonl"], \
        "no MP4 stored: only the finished run's result files"


def test_a_key_too_long_for_the_store_fails_in_one_attempt_and_its_neighbours_are_stored(tmp_path, model_cache,
                                                                                         registry):
    """Submitted without the manifest's room check (no output given to load_manifest), an id of 80 CJK characters
    (3 bytes each in UTF-8: 240 bytes) fits the run's folder as `<id>.mp4` (244 bytes) but not the temporary name the
    local store writes first, `.<id>.mp4.<16 hex>.tmp`: 1 + 240 + 4 + 1 + 16 + 4 = 266 bytes, over NAME_MAX (255)."""
    long_id = "東" * 80
    settings, factory, engine = submit(tmp_path, model_cache, registry,
                                       f"  - {{id: {long_id}, prompt: video 0}}\n  - {{id: v1, prompt: video 1}}\n",
                                       f"file://{tmp_path / 'out'}/")
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded, result.retried, result.failed) == (2, 1, 0, 1)
    found = videos(factory)
    too_long = found[long_id]
    assert (Status(too_long.status), too_long.attempts) == (Status.FAILED, 1)
    assert too_long.last_error.startswith("KeyTooLong: file://"), too_long.last_error
    assert ": its temporary file name '.東東東" in too_long.last_error
    assert too_long.last_error.endswith("would be 266 bytes, over the 255-byte limit"), too_long.last_error
    assert (Status(found["v1"].status), found["v1"].attempts) == (Status.SUCCEEDED, 1)
    assert charges(factory) == {long_id: ["retry"], "v1": ["gpu", "storage"]}


def test_an_ungated_lossy_setting_spends_no_attempt_its_work_waits_unclaimed(tmp_path, model_cache, registry):
    """guidance_fraction=0.5 with no recorded gate: a worker claims none of the model's work (jobs.render.serving.
    gated_models), so no render is tried and no attempt is spent: the three videos wait, pending with 0 attempts,
    until a gate is recorded (`reelbatch status` says why). The error's own decision (fail now) is in the table
    above; it decides a render that meets it anyway."""
    settings, factory, engine = submit(tmp_path, model_cache, registry,
                                       "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(3)),
                                       f"file://{tmp_path / 'out'}/", settings={"engine.guidance_fraction": 0.5})
    first = render_next_batch(settings, engine, factory)
    assert (first.claimed, first.released, first.retried, first.failed) == (0, 0, 0, 0)
    assert [(Status(v.status), v.attempts) for v in _units(factory)] == [(Status.PENDING, 0)] * 3
    assert charges(factory) == {}, "the model never loaded: no seconds were spent on a render"


def _units(factory):
    from jobs.db.rows import WorkUnit

    with factory() as s:
        return list(s.scalars(select(WorkUnit)))


@pytest.fixture
def gate(s3_server, monkeypatch):
    """The S3 endpoint as the worker sees it: moto behind a gate that can refuse connections."""
    gate = TcpGate(urlsplit(s3_server.endpoint_url).port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gate.url)
    yield gate
    gate.close()


def test_a_store_outage_is_retried_and_the_retry_stores_the_video(tmp_path, model_cache, registry, s3_env, gate):
    """The S3 endpoint refuses connections during the first attempt (StoreUnavailable, which may pass): the video
    goes back to pending with 1 attempt spent and its render charged as a "retry"; once the store answers, its
    second attempt stores it and is charged as usual."""
    settings, factory, engine = submit(tmp_path, model_cache, registry, "  - {id: v0, prompt: video 0}\n",
                                       f"s3://{s3_env}/")
    gate.close()
    down = render_next_batch(settings, engine, factory)
    assert (down.claimed, down.succeeded, down.retried, down.failed) == (1, 0, 1, 0)
    v0 = videos(factory)["v0"]
    assert (Status(v0.status), v0.attempts) == (Status.PENDING, 1)
    assert v0.last_error.startswith("StoreUnavailable: ") and "cannot reach the S3 endpoint" in v0.last_error
    gate.open()
    import time

    time.sleep(0.05)  # past the 0.01 s backoff
    up = render_next_batch(settings, engine, factory)
    assert (up.claimed, up.succeeded) == (1, 1)
    v0 = videos(factory)["v0"]
    assert (Status(v0.status), v0.attempts, v0.last_error) == (Status.SUCCEEDED, 2, None)
    assert charges(factory) == {"v0": ["retry", "gpu", "storage"]}
