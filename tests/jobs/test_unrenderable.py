"""A shape the model cannot render fails its video on the first attempt, with the pipeline's error, through the real
render path (claim -> engine -> store -> rows). `tiny` renders every shape a manifest admits (16x16 to 2048 px a
side, up to its 33-frame window: tried), so the model is `toy`, whose transformer's position table (rope_max_seq_len
64) covers 64 patches a side: 2048 px is 256 of them, and its first transformer call raises `RuntimeError: shape
'[1, 256, 1, -1]' is invalid for input of size 640`, as every later attempt would.

Submit refuses that shape now (engine.models.shape_rules; tests/jobs/test_submit_shapes.py), so the run is recorded as one
submitted before the rule was read would be: against a registration of `toy` without its rules. The render path
must still fail such a video at once, whatever let it in."""

import dataclasses

import pytest
from sqlalchemy import select

from engine.engine import Engine
from engine.models.registry import Registry
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import Video
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.render.batch import render_next_batch
from jobs.settings import Settings


@pytest.fixture
def world(tmp_path, model_cache):
    registry = Registry()
    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 'r.db'}",
                                                  "engine.cache_dir": model_cache, "worker.max_batch": 4,
                                                  "limits.retry_backoff_s": 0.01})
    factory = session_factory(settings.database_url)
    manifest = tmp_path / "r.yaml"
    manifest.write_text("name: r\nmodel: toy\ndefaults: {steps: 2}\nvideos:\n"
                        "  - {id: ok0, prompt: a red square}\n"
                        "  - {id: tall1, prompt: a red square, resolution: 32x2048}\n"
                        "  - {id: tall2, prompt: a blue square, resolution: 32x2048}\n"
                        "  - {id: ok3, prompt: a blue square}\n")
    unruled = Registry()
    unruled.models["toy"] = dataclasses.replace(unruled.models["toy"], rules=None)
    submission.submit_run(factory, load_manifest(manifest, registry=unruled),
                          output=f"file://{tmp_path / 'out'}/")
    return settings, factory, Engine(settings.engine_config(), registry)


def test_a_shape_the_model_cannot_render_fails_at_once_and_its_batch_mates_succeed(world):
    settings, factory, engine = world
    results = []
    while (result := render_next_batch(settings, engine, factory)).claimed:
        results.append((result.claimed, result.succeeded, result.retried, result.failed, result.released))
        assert len(results) < 10, results
    # The two tall ones are one batch: handed back to be claimed alone (no attempt counted), then each fails alone.
    assert sorted(results) == sorted([(2, 2, 0, 0, 0), (2, 0, 0, 0, 2), (1, 0, 0, 1, 0), (1, 0, 0, 1, 0)])
    with factory() as s:
        videos = {v.key: (Status(v.status).value, v.attempts, v.last_error) for v in s.scalars(select(Video))}
    error = ("UnrenderableInput: RuntimeError before the first denoising step of toy|32x2048|f9|s2|g2: "
             "shape '[1, 256, 1, -1]' is invalid for input of size 640")
    assert videos == {"ok0": ("succeeded", 1, None), "ok3": ("succeeded", 1, None),
                      "tall1": ("failed", 1, error), "tall2": ("failed", 1, error)}
