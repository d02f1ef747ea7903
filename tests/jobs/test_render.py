"""One batch through the real path: claim -> tiny engine -> PyAV -> store -> rows, with no Celery in between."""

import dataclasses

import pytest
from sqlalchemy import select

from engine.engine import Engine
from jobs import queries
from jobs.db import session_factory
from jobs.manifest import load_manifest
from jobs.models import CostRecord, Video
from jobs.render import render_next_batch
from jobs.settings import Settings
from jobs.status import Status
from storage.encode import probe_mp4


@pytest.fixture
def setup(tmp_path, model_cache, registry):
    settings = dataclasses.replace(Settings.from_env({}), database_url=f"sqlite:///{tmp_path / 'r.db'}",
                                   cache_dir=model_cache, max_batch=8, gpu_hour_usd=3.6)
    factory = session_factory(settings.database_url)
    manifest = tmp_path / "r.yaml"
    manifest.write_text("name: r\ndefaults: {steps: 2}\nvideos:\n"
                        + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(3)))
    spec = load_manifest(manifest, registry=registry)
    queries.submit_run(factory, spec, output=f"file://{tmp_path / 'out'}/")
    return settings, factory, Engine(settings.engine_config(), registry), tmp_path / "out" / "r"


def test_a_batch_renders_encodes_stores_and_costs(setup):
    settings, factory, engine, folder = setup
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded, result.failed) == (3, 3, 0)
    assert render_next_batch(settings, engine, factory).claimed == 0, "nothing left to claim"
    with factory() as s:
        videos = list(s.scalars(select(Video).order_by(Video.id)))
        costs = {c.video_id: c for c in s.scalars(select(CostRecord))}
    for v in videos:
        assert Status(v.status) is Status.SUCCEEDED and v.attempts == 1
        info = probe_mp4(folder / f"{v.key}.mp4")
        assert (info.frames, info.width, info.height, info.fps) == (9, 64, 64, 8)
        cost = costs[v.id]
        assert cost.seconds == pytest.approx(v.render_s + v.encode_s + v.upload_s)
        assert cost.amount_micro_usd == round(cost.seconds * 3.6 / 3600 * 1e6) > 0
    # Same shape: the batch's render time is shared equally.
    assert len({round(v.render_s, 9) for v in videos}) == 1


def test_an_existing_different_object_is_never_overwritten(setup):
    settings, factory, engine, folder = setup
    folder.mkdir(parents=True)
    (folder / "v1.mp4").write_bytes(b"somebody else's video")
    result = render_next_batch(settings, engine, factory)
    assert (result.succeeded, result.failed) == (2, 1), "one bad video must not fail its neighbours"
    assert (folder / "v1.mp4").read_bytes() == b"somebody else's video"
    with factory() as s:
        v1 = s.scalar(select(Video).where(Video.key == "v1"))
        assert s.scalar(select(CostRecord).where(CostRecord.video_id == v1.id)) is None
    assert Status(v1.status) is Status.FAILED
    assert "ObjectConflict" in v1.last_error and "v1.mp4" in v1.last_error
