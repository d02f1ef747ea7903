"""Videos that start from an image through the real job path: manifest -> rows -> claim -> tiny engine -> MP4 -> store,
with local and S3 images, image and text-only videos in one batch, long videos, and images that changed since submit."""

import io
import time

import boto3
import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select

from engine.engine import Engine
from engine.frames.images import fit_image
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import Video
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.manifest.policy import ManifestPolicy
from jobs.quality.evaluate import round_trip
from jobs.render.batch import render_next_batch
from jobs.settings import Settings
from storage.encode import decode_frames


def picture(seed: int, width: int = 96, height: int = 64) -> np.ndarray:
    cells = np.random.default_rng(seed).integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    return np.repeat(np.repeat(cells, 8, axis=0), 8, axis=1)


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def farm(tmp_path, model_cache, registry):
    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 'r.db'}",
                                                  "engine.cache_dir": model_cache, "worker.max_batch": 8,
                                                  "limits.max_attempts": 2, "limits.retry_backoff_s": 0.01})
    factory = session_factory(settings.database_url)
    engine = Engine(settings.engine_config(), registry)

    def submit(text: str, **options):
        manifest = tmp_path / "r.yaml"
        manifest.write_text(text)
        spec = load_manifest(manifest, registry=registry, policy=ManifestPolicy(**options))
        submission.submit_run(factory, spec, output=f"file://{tmp_path / 'out'}/")
        return spec

    return settings, factory, engine, submit, tmp_path


def same_video(a: np.ndarray, b: np.ndarray) -> bool:
    """Two decoded MP4s of one video. Raw frames differ by at most one step alone and in a batch
    (tests/engine/test_image_to_video.py), but libx264 does not always give the same bytes for the same frames on this
    machine (two encodes of one video measured 0.12 apart on average, as close as 38.6 dB), while two different tiny
    videos measured 2.2 apart (tiny's random VAE makes similar-looking noise)."""
    return a.shape == b.shape and np.abs(a.astype(int) - b.astype(int)).mean() < 0.5


def stored(tmp_path, run: str, key: str) -> np.ndarray:
    return decode_frames((tmp_path / "out" / run / f"{key}.mp4").read_bytes())


def test_image_and_text_only_videos_share_a_batch_and_each_renders_as_it_does_alone(farm):
    settings, factory, engine, submit, tmp_path = farm
    (tmp_path / "shoe.png").write_bytes(png(picture(1)))
    (tmp_path / "boot.png").write_bytes(png(picture(2, 64, 96)))
    submit("name: r\ndefaults: {steps: 2}\nvideos:\n"
           "  - {id: shoe, prompt: a shoe, image: shoe.png}\n"
           "  - {id: words, prompt: a shoe}\n"
           "  - {id: boot, prompt: a boot, image: boot.png, fit: pad}\n"
           "  - {id: shoe2, prompt: a shoe again, image: shoe.png, seed: 9}\n")
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded) == (4, 4), "one batch: images and text share a shape"
    # The same videos rendered one by one through the engine, from the images fitted as the worker fits them.
    with factory() as s:
        videos = {v.key: v for v in s.scalars(select(Video))}
    shape = Shape("tiny", 64, 64, 9, 2, 5.0)
    images = {"shoe": fit_image(picture(1), 64, 64, "crop"), "boot": fit_image(picture(2, 64, 96), 64, 64, "pad"),
              "shoe2": fit_image(picture(1), 64, 64, "crop"), "words": None}
    for key, video in videos.items():
        (alone,) = engine.render(RenderBatch(shape, (RenderRequest(video.id, video.prompt, None, video.seed,
                                                                   image=images[key]),)))
        assert same_video(stored(tmp_path, "r", key), round_trip(alone.frames, 8)), key
    assert (videos["shoe"].image_fit, videos["boot"].image_fit, videos["words"].image_uri) == ("crop", "pad", None)


def test_an_image_that_changed_since_submit_fails_its_own_attempt_with_a_clear_error(farm):
    settings, factory, engine, submit, tmp_path = farm
    (tmp_path / "a.png").write_bytes(png(picture(3)))
    (tmp_path / "b.png").write_bytes(png(picture(4)))
    submit("name: r\ndefaults: {steps: 2}\nvideos:\n  - {id: a, prompt: p, image: a.png}\n"
           "  - {id: b, prompt: p, image: b.png}\n")
    (tmp_path / "a.png").write_bytes(png(picture(5)))
    result = render_next_batch(settings, engine, factory)
    assert (result.claimed, result.succeeded, result.retried) == (2, 1, 1)
    with factory() as s:
        a = s.scalar(select(Video).where(Video.key == "a"))
    assert Status(a.status) is Status.PENDING and a.attempts == 1
    assert a.last_error.startswith(f"image {(tmp_path / 'a.png').as_uri()} changed since the run was submitted: its "
                                   f"bytes hash to sha256 ")
    assert not (tmp_path / "out" / "r" / "a.mp4").exists()
    (tmp_path / "a.png").unlink()
    time.sleep(0.05)
    last = render_next_batch(settings, engine, factory)
    assert (last.claimed, last.failed) == (1, 1), "its second and last attempt"
    with factory() as s:
        a = s.scalar(select(Video).where(Video.key == "a"))
    assert Status(a.status) is Status.FAILED
    uri = (tmp_path / "a.png").as_uri()
    assert a.last_error == f"failed after 2 attempts: cannot read the image: no object at {uri}"


def test_images_from_s3(farm, s3_env):
    settings, factory, engine, submit, tmp_path = farm
    boto3.session.Session().client("s3").put_object(Bucket=s3_env, Key="in/a.png", Body=png(picture(6, 64, 64)))
    submit(f"name: r\ndefaults: {{steps: 2}}\nvideos: [{{id: a, prompt: p, image: s3://{s3_env}/in/a.png}}]\n",
           allowed_inputs=[f"s3://{s3_env}/in/"])
    assert render_next_batch(settings, engine, factory).succeeded == 1
    (alone,) = engine.render(RenderBatch(Shape("tiny", 64, 64, 9, 2, 5.0),
                                         (RenderRequest(1, "p", None, _seed(factory), image=picture(6, 64, 64)),)))
    assert same_video(stored(tmp_path, "r", "a"), round_trip(alone.frames, 8))


def test_a_long_video_reads_its_image_for_the_first_chunk_only(farm, monkeypatch):
    import jobs.render.images as images

    settings, factory, engine, submit, tmp_path = farm
    (tmp_path / "a.png").write_bytes(png(picture(7, 64, 64)))
    submit("name: r\ndefaults: {steps: 2}\nvideos: [{id: a, prompt: p, image: a.png, duration_s: 6}]\n")
    reads = []
    real = images.read_input
    monkeypatch.setattr(images, "read_input", lambda uri, **kw: reads.append(uri) or real(uri, **kw))
    while render_next_batch(settings, engine, factory).claimed:
        pass
    with factory() as s:
        video = s.scalar(select(Video))
    assert (Status(video.status), video.chunks) == (Status.SUCCEEDED, 2)
    assert reads == [(tmp_path / "a.png").as_uri()], "read once, for chunk 0"
    assert stored(tmp_path, "r", "a").shape == (49, 64, 64, 3)


def _seed(factory) -> int:
    with factory() as s:
        return s.scalar(select(Video.seed))


def test_a_long_video_from_a_picture_on_the_pipeline_image_path_finishes_as_one_mp4(farm):
    """`tiny-i2v` (image_condition: pipeline, a 33-frame window): 6 s at 8 fps is 49 frames, two chunks, the second
    conditioned on the first's last frames (engine.loop.i2v); the stored MP4 decodes to 49 frames and is the video
    Engine.render_long makes in one process."""
    from engine.long.chunks import plan

    settings, factory, engine, submit, tmp_path = farm
    (tmp_path / "a.png").write_bytes(png(picture(8, 32, 32)))
    submit("name: r\nmodel: tiny-i2v\ndefaults: {steps: 2, resolution: 32x32}\nvideos: [{id: a, prompt: p, image: a.png, duration_s: 6}]\n")
    while render_next_batch(settings, engine, factory).claimed:
        pass
    with factory() as s:
        video = s.scalar(select(Video))
    assert (Status(video.status), video.chunks) == (Status.SUCCEEDED, 2)
    frames = stored(tmp_path, "r", "a")
    assert frames.shape == (49, 32, 32, 3)
    reference, _ = engine.render_long(Shape("tiny-i2v", 32, 32, 33, 2, 5.0),
                                      RenderRequest(1, "p", None, _seed(factory), image=picture(8, 32, 32)),
                                      plan(49, 33, 2, 4))
    assert same_video(frames, round_trip(reference.frames, 8))
