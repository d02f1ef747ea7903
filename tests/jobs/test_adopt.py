"""Retries of a video whose earlier attempt uploaded its MP4 (or was about to) but never recorded it, through the real
path: claim -> tiny engine -> PyAV -> a store (an S3-protocol server behind a TCP gate the test shuts like an outage,
or a local folder) -> rows."""

import dataclasses
import hashlib
import time
from urllib.parse import urlsplit

import numpy as np
import pytest
from sqlalchemy import select

from engine.engine import Engine
from jobs.claims import leases
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import Video
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.render import record
from jobs.render.batch import render_next_batch
from jobs.settings import Settings
from storage.local import LocalStore
from tests.e2e.procs import TcpGate


@pytest.fixture
def gate(s3_server, monkeypatch):
    """The S3 endpoint as the worker sees it: moto behind a gate that can refuse connections."""
    gate = TcpGate(urlsplit(s3_server.endpoint_url).port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gate.url)
    yield gate
    gate.close()


def one_video_run(tmp_path, model_cache, registry, output: str):
    """Run `a` of one tiny video, v0 (2 steps), submitted to SQLite for `output`; leases of 0.5 s."""
    manifest = tmp_path / "a.yaml"
    manifest.write_text("name: a\ndefaults: {steps: 2}\nvideos:\n  - {id: v0, prompt: video 0}\n")
    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 'a.db'}",
                                                  "engine.cache_dir": model_cache, "limits.lease_s": 0.5,
                                                  "limits.retry_backoff_s": 0.01})
    factory = session_factory(settings.database_url)
    submission.submit_run(factory, load_manifest(manifest, registry=registry), output=output)
    return settings, factory


def test_a_retry_that_cannot_check_its_earlier_upload_waits_for_the_store_instead_of_rendering(
        tmp_path, model_cache, registry, s3_env, gate, monkeypatch):
    """The first attempt stores v0's MP4 and dies before recording it. The retry comes while the store is down: it
    cannot ask whether that MP4 is there, so it retries without a render (a render again could make other bytes,
    which would then meet the stored MP4 as a conflict and fail the video), keeping the recorded checksum. Once the
    store answers, the next attempt adopts the MP4 the first one stored, and nothing is rendered a second time."""
    settings, factory = one_video_run(tmp_path, model_cache, registry, f"s3://{s3_env}/")
    engine = Engine(settings.engine_config(), registry)
    renders = []
    render = engine.render
    engine.render = lambda *args, **kwargs: renders.append(1) or render(*args, **kwargs)

    def dies(*args, **kwargs):
        raise ConnectionError("the worker died before recording")

    with monkeypatch.context() as m:
        m.setattr(record, "record_successes", dies)
        with pytest.raises(ConnectionError):
            render_next_batch(settings, engine, factory)
    import boto3
    body = boto3.session.Session().client("s3").get_object(Bucket=s3_env, Key="a/v0.mp4")["Body"].read()
    with factory() as s:
        assert s.scalar(select(Video.upload_sha256)) == hashlib.sha256(body).hexdigest()
    time.sleep(0.7)
    assert leases.reap_expired(factory, max_attempts=5) == {"tiny": 1}

    gate.close()
    down = render_next_batch(settings, engine, factory)
    assert (down.claimed, down.succeeded, down.retried, down.failed) == (1, 0, 1, 0)
    assert len(renders) == 1, "rendered again while the store could not say what it holds"
    with factory() as s:
        v0 = s.scalar(select(Video))
    assert Status(v0.status) is Status.PENDING and v0.upload_sha256 == hashlib.sha256(body).hexdigest()
    assert "cannot reach the S3 endpoint" in v0.last_error, v0.last_error

    gate.open()
    time.sleep(0.1)  # the retry's backoff: 0.01 s doubled per attempt
    up = render_next_batch(settings, engine, factory)
    assert (up.claimed, up.succeeded) == (1, 1) and len(renders) == 1
    with factory() as s:
        v0 = s.scalar(select(Video))
    assert Status(v0.status) is Status.SUCCEEDED and v0.sha256 == hashlib.sha256(body).hexdigest()
    assert v0.uri == f"s3://{s3_env}/a/v0.mp4" and v0.render_s == 0.0, "adopted, not rendered again"


class Died(BaseException):
    """The worker's death, as the store saw it: nothing after it runs (a BaseException, so no handler takes it)."""


def test_an_earlier_attempts_upload_that_lands_after_the_retry_rendered_is_adopted_not_a_conflict(
        tmp_path, model_cache, registry, monkeypatch):
    """Worker A records v0's checksum and freezes before its upload lands; its lease expires; worker B, on another
    machine whose engine rounds differently, finds the key empty and renders v0 again. Then A thaws and its upload
    lands, before B's. B's MP4 meets A's as a different object: it is v0's own (its checksum is the one A recorded),
    so B adopts it instead of failing v0 as a conflict."""
    settings, factory = one_video_run(tmp_path, model_cache, registry, f"file://{tmp_path}/out/")
    # A's machine rounds otherwise (as bfloat16 on a GPU would): the same video, other pixels, other bytes. Not bf16 on
    # this CPU: ATen held to AVX2 (engine/levers/cpu_math.py) has no bf16 attention kernel ("pack_vnni2 ... avx512").
    engine_a = Engine(settings.engine_config(), registry)
    engine_b = Engine(settings.engine_config(), registry)
    render_a = engine_a.render

    def render_rounded_otherwise(*args, **kwargs):
        return [dataclasses.replace(v, frames=np.clip(v.frames.astype(np.int16) + 3, 0, 255).astype(np.uint8))
                for v in render_a(*args, **kwargs)]

    engine_a.render = render_rounded_otherwise
    held = {}

    def frozen_put(self, key, data, **kwargs):
        held.update(key=key, data=data, sha256=kwargs["sha256"])
        raise Died

    with monkeypatch.context() as m:
        m.setattr(LocalStore, "put", frozen_put)
        with pytest.raises(Died):
            render_next_batch(settings, engine_a, factory)
    with factory() as s:
        assert s.scalar(select(Video.upload_sha256)) == held["sha256"]
    time.sleep(0.7)
    assert leases.reap_expired(factory, max_attempts=5) == {"tiny": 1}

    render = engine_b.render

    def render_then_a_thaws(*args, **kwargs):
        rendered = render(*args, **kwargs)
        LocalStore(tmp_path / "out").put(held["key"], held["data"], sha256=held["sha256"], metadata={})
        return rendered

    engine_b.render = render_then_a_thaws
    result = render_next_batch(settings, engine_b, factory)
    assert (result.claimed, result.succeeded, result.failed) == (1, 1, 0)
    with factory() as s:
        v0 = s.scalar(select(Video))
    assert v0.upload_sha256 != held["sha256"], "B encoded the same bytes as A: nothing here would conflict"
    assert Status(v0.status) is Status.SUCCEEDED and v0.sha256 == held["sha256"], v0.last_error
    assert (tmp_path / "out" / "a" / "v0.mp4").read_bytes() == held["data"]
    assert v0.poster_uri == f"file://{tmp_path}/out/a/v0.jpg" and (tmp_path / "out" / "a" / "v0.jpg").is_file()
