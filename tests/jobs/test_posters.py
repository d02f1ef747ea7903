"""Posters and encoder settings through the real render path: claim -> tiny engine -> PyAV -> store -> rows, the
poster opened as a JPEG and the MP4s decoded."""

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select

from engine.engine import Engine
from jobs.claims import leases
from jobs.db import queries, submission
from jobs.db.connect import session_factory
from jobs.db.rows import Video
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.render import record
from jobs.render.batch import render_next_batch
from jobs.reports.summary import report_dict
from jobs.settings import Settings
from storage.encode import decode_frames, probe_mp4
from storage.poster import poster_jpeg
from tests.conftest import REPO


def submit(tmp_path, registry, *run_fields, videos=2):
    manifest = tmp_path / "p.yaml"
    manifest.write_text("name: p\n" + "".join(f"{f}\n" for f in run_fields) + "defaults: {steps: 2}\nvideos:\n"
                        + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(videos)))
    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 'p.db'}",
                                                  "worker.max_batch": 8})
    factory = session_factory(settings.database_url)
    submission.submit_run(factory, load_manifest(manifest, registry=registry), output=f"file://{tmp_path / 'out'}/")
    return settings, factory, tmp_path / "out" / "p"


@pytest.fixture
def engine(model_cache, registry):
    settings = Settings.from_env({}).with_values({"engine.cache_dir": model_cache})
    return Engine(settings.engine_config(), registry)


def test_every_stored_video_has_its_middle_frame_as_a_jpeg_poster_beside_it(tmp_path, registry, engine):
    settings, factory, folder = submit(tmp_path, registry)
    assert render_next_batch(settings, engine, factory).succeeded == 2
    run, videos = queries.load_report(factory, "p")
    report = report_dict(run, videos)
    results = {r["id"]: r for r in map(json.loads, (folder / "results.jsonl").read_text().splitlines())}
    for v, _ in videos:
        poster = folder / f"{v.key}.jpg"
        assert v.poster_uri == poster.as_uri()
        assert results[v.key]["poster_uri"] == v.poster_uri
        assert next(r for r in report["videos"] if r["id"] == v.key)["poster_uri"] == v.poster_uri
        image = Image.open(poster)
        assert (image.format, image.size) == ("JPEG", (64, 64))
        # The poster is what a player shows at frame 4 of 9: closer to it than to any other frame of the MP4.
        frames = decode_frames(folder / f"{v.key}.mp4").astype(float)
        errors = [np.abs(np.asarray(image, dtype=float) - f).mean() for f in frames]
        assert int(np.argmin(errors)) == 4, errors


def test_the_run_encoder_settings_reach_the_mp4(tmp_path, registry, engine):
    settings, factory, folder = submit(tmp_path, registry, "codec: h265", "crf: 30", "preset: ultrafast")
    assert render_next_batch(settings, engine, factory).succeeded == 2
    run, videos = queries.load_report(factory, "p")
    assert report_dict(run, videos)["encoding"] == {"codec": "h265", "crf": 30, "preset": "ultrafast"}
    for v, _ in videos:
        info = probe_mp4(folder / f"{v.key}.mp4")
        assert (info.codec, info.frames, info.width) == ("hevc", 9, 64)
        assert Image.open(folder / f"{v.key}.jpg").format == "JPEG"


def test_a_poster_conflict_leaves_the_video_stored_without_one(tmp_path, registry, engine):
    """Another object at v1's poster key is never overwritten, and never fails the video: it is recorded without a
    poster (reports then make one from its MP4)."""
    settings, factory, folder = submit(tmp_path, registry)
    folder.mkdir(parents=True)
    (folder / "v1.jpg").write_bytes(b"somebody else's picture")
    assert render_next_batch(settings, engine, factory).succeeded == 2
    with factory() as s:
        posters = dict(s.execute(select(Video.key, Video.poster_uri)).all())
    assert posters == {"v0": (folder / "v0.jpg").as_uri(), "v1": None}
    assert (folder / "v1.jpg").read_bytes() == b"somebody else's picture"
    # The HTML report shows v0's stored poster and, for v1, one made from its MP4 (never the foreign file).
    page = tmp_path / "p.html"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_DATABASE_URL": settings.database_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "jobs", "report", "p", "--html", str(page)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shown = [base64.b64decode(b) for b in re.findall(r'src="data:image/jpeg;base64,([^"]+)"', page.read_text())]
    assert shown == [(folder / "v0.jpg").read_bytes(), poster_jpeg((folder / "v1.mp4").read_bytes())]


def test_an_adopted_upload_gets_the_same_poster_its_first_attempt_made(tmp_path, registry, engine, monkeypatch):
    """The worker stores the MP4 and its poster, then dies before recording them. The poster is lost with it (here:
    deleted) and the retry adopts the MP4 by its recorded checksum: it puts the poster again, byte for byte the one
    the first attempt made, because a poster is made from the MP4's bytes."""
    settings, factory, folder = submit(tmp_path, registry, videos=1)
    settings = settings.with_values({"limits.lease_s": 0.5})

    def dies(*args, **kwargs):
        raise ConnectionError("the worker died before recording")

    monkeypatch.setattr(record, "record_successes", dies)
    with pytest.raises(ConnectionError):
        render_next_batch(settings, engine, factory)
    monkeypatch.undo()
    first = (folder / "v0.jpg").read_bytes()
    (folder / "v0.jpg").unlink()
    time.sleep(0.7)
    assert leases.reap_expired(factory, max_attempts=3) == {"tiny": 1}
    again = render_next_batch(settings, engine, factory)
    assert (again.claimed, again.succeeded) == (1, 1)
    with factory() as s:
        v0 = s.scalar(select(Video))
    assert Status(v0.status) is Status.SUCCEEDED and v0.render_s == 0.0, "adopted, not rendered again"
    assert hashlib.sha256((folder / "v0.jpg").read_bytes()).digest() == hashlib.sha256(first).digest()
    assert v0.poster_uri == (folder / "v0.jpg").as_uri()
    assert Image.open(io.BytesIO(first)).format == "JPEG"
