"""Long videos through the real job path on the tiny model: chunks as work units batched with short videos of the
window's shape, checkpoints in the store, the stitch, the seam score, and a resume after a lost worker."""

import json
import time

import numpy as np
import pytest
from sqlalchemy import select

from engine.engine import Engine
from engine.models.registry import TINY
from engine.types import RenderRequest, Shape
from jobs.claims import claims, leases
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.status import Status
from jobs.manifest import derive_seed, load_manifest
from jobs.render import record
from jobs.render.batch import render_next_batch
from jobs.settings import Settings
from storage.encode import decode_frames, probe_mp4

WINDOW = Shape("tiny", 64, 64, TINY.max_frames, 2, 5.0)  # 33 frames
LONG_FRAMES = 73  # 9 s at 8 fps: 19 latents = 3 chunks of 9 latents overlapping by 2


@pytest.fixture
def farm(tmp_path, model_cache, registry):
    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 'l.db'}",
                                                  "engine.cache_dir": model_cache, "worker.max_batch": 4})
    factory = session_factory(settings.database_url)
    manifest = tmp_path / "l.yaml"
    manifest.write_text("name: l\ndefaults: {steps: 2, duration_s: 4}\nvideos:\n"
                        "  - {id: long, prompt: a long one, duration_s: 9}\n"
                        + "".join(f"  - {{id: s{i}, prompt: short {i}}}\n" for i in range(3)))
    spec = load_manifest(manifest, registry=registry)
    submission.submit_run(factory, spec, output=f"file://{tmp_path / 'out'}/")
    engine = Engine(settings.engine_config(), registry)
    # What the engine decodes for each video (by database id), to compare before the MP4's lossy encode.
    decoded: dict[int, np.ndarray] = {}
    for name in ("render", "decode"):
        original = getattr(engine, name)

        def observed(*args, _original=original, **kwargs):
            result = _original(*args, **kwargs)
            for video in result if isinstance(result, list) else [result]:
                if video.frames is not None:
                    decoded[video.request.video_id] = video.frames
            return result

        setattr(engine, name, observed)
    return settings, factory, engine, tmp_path / "out", decoded


def units(factory) -> list[tuple[str, int, Status, int, bool]]:
    with factory() as s:
        rows = s.execute(select(Video.key, WorkUnit.chunk, WorkUnit.status, WorkUnit.attempts, WorkUnit.ready)
                         .join(Video).order_by(Video.id, WorkUnit.chunk)).all()
    return [(k, c, Status(st), a, r) for k, c, st, a, r in rows]


def reference(engine: Engine, seed: int) -> np.ndarray:
    """The same long video rendered alone, chunk after chunk, in one process."""
    video, chunks = Engine.render_long(engine, WINDOW, RenderRequest(0, "a long one", None, seed),
                                       TINY.chunk_plan(LONG_FRAMES))
    assert len(chunks) == 3
    return video.frames


def test_a_long_video_is_chunks_that_batch_with_short_videos(farm):
    settings, factory, engine, out, decoded = farm
    assert [(k, c, r) for k, c, _, _, r in units(factory)] == [
        ("long", 0, True), ("long", 1, False), ("long", 2, False), ("s0", 0, True), ("s1", 0, True), ("s2", 0, True)]
    first = render_next_batch(settings, engine, factory)
    assert (first.claimed, first.succeeded) == (4, 3), "chunk 0 shares the window's batch with the short videos"
    with factory() as s:
        long = s.scalar(select(Video).where(Video.key == "long"))
    assert Status(long.status) is Status.PENDING and long.render_s > 0, "between chunks the video waits, seconds kept"
    assert [u[4] for u in units(factory)[:3]] == [True, True, False], "chunk 1 is ready now, chunk 2 not yet"
    assert list((out / "_chunks" / "l" / "long").iterdir()), "chunk 0's latents are checkpointed in the store"
    assert render_next_batch(settings, engine, factory).claimed == 1
    last = render_next_batch(settings, engine, factory)
    assert (last.claimed, last.succeeded) == (1, 1)
    assert render_next_batch(settings, engine, factory).claimed == 0

    with factory() as s:
        long = s.scalar(select(Video).where(Video.key == "long"))
        costs = s.scalars(select(CostRecord).where(CostRecord.video_id == long.id, CostRecord.kind == "gpu")).all()
    assert Status(long.status) is Status.SUCCEEDED and long.chunks == 3 and long.frames == LONG_FRAMES
    info = probe_mp4(out / "l" / "long.mp4")
    assert (info.frames, info.fps) == (LONG_FRAMES, 8) and info.duration_s == pytest.approx(LONG_FRAMES / 8)
    assert decode_frames((out / "l" / "long.mp4").read_bytes()).shape == (LONG_FRAMES, 64, 64, 3)
    assert long.seam_score is not None and long.seam_score > 0 and long.needs_review == (long.seam_score > 2.0)
    # Its checks include its seams (jobs.render.checks), against the registration's limit (2.0 by default).
    seam = json.loads(long.checks)["seam"]
    assert (seam["value"], seam["limit"], seam["passed"]) == (round(long.seam_score, 6), 2.0, long.seam_score <= 2.0)
    # One charge per chunk, as each finished: its render share, plus the checkpoint (or, for the last, stitching,
    # encoding and upload) that no render overlapped.
    charged = sum(c.seconds for c in costs)
    assert len(costs) == 3 and long.render_s + long.encode_s + long.upload_s <= charged
    assert charged < long.render_s + long.encode_s + long.upload_s + long.decode_s + 1.0
    assert not any((out / "_chunks").rglob("*.safetensors")), "checkpoints are removed once the video succeeded"
    # Rendered inside a mixed batch, chunk by chunk through the store, it is the video rendered alone.
    alone = reference(engine, long.seed)
    diff = np.abs(decoded[long.id].astype(int) - alone.astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.01, (diff.max(), diff.mean())


def test_a_worker_lost_between_chunks_resumes_from_the_checkpoint(farm):
    """A worker dies holding chunk 1 (its lease is all that is left of it); the reaper hands the chunk on, and only
    the unfinished chunks render again: chunk 0 is never claimed twice."""
    settings, factory, engine, out, decoded = farm
    render_next_batch(settings, engine, factory)  # chunk 0 and the short videos
    dead = claims.claim_batch(factory, owner="dead-worker", max_batch=4, lease_s=0.3)
    assert [(u.key, u.chunk) for u in dead.units] == [("long", 1)]
    time.sleep(0.5)
    assert leases.reap_expired(factory, max_attempts=3) == {"tiny": 1}
    while render_next_batch(settings, engine, factory).claimed:
        pass
    by_chunk = {c: (st, a) for k, c, st, a, _ in units(factory) if k == "long"}
    assert by_chunk == {0: (Status.SUCCEEDED, 1), 1: (Status.SUCCEEDED, 2), 2: (Status.SUCCEEDED, 1)}
    with factory() as s:
        long = s.scalar(select(Video).where(Video.key == "long"))
    assert Status(long.status) is Status.SUCCEEDED
    alone = reference(engine, derive_seed("l", "long"))
    diff = np.abs(decoded[long.id].astype(int) - alone.astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.01, "the resumed video is the uninterrupted one"


TOY_LONG = [("a red circle moving left on a black background", 3),
            ("a green square moving down on a gray background", 4),
            ("a yellow circle moving right on a black background", 5),
            ("a blue square moving up on a gray background", 6)]


def test_toy_videos_four_windows_long_keep_their_prompt_mostly_and_do_not_jump_at_seams(tmp_path):
    """The trained toy model, 4 s at 8 fps (33 frames: 5 chunks of its 9-frame window) through the job path, four
    videos whose chunks batch together, each chunk held to the clean end of the one before (the toy's
    chunk_condition) and starting from its own noise (engine.long.chunks.chunk_seed). Each 9-frame window of the decoded
    MP4 is judged, and the object is tracked frame by frame: no step at a seam is over 1.5x the largest step inside
    a chunk (with the re-noised tie the same videos stepped 6-15 px backwards at seams). Colour holds in every
    window (run 6's decoder turned red to blue late in a clip); direction in the first window of every video and in
    at least 90% of windows: measured 18 of 20 on run 7, where the blue square, already rendered as a blurred
    circle in its first window, wanders in its second and third (docs/LONG_VIDEOS.md). No seam step is over 3x its
    video's median step (seam_jump), and no video is flagged."""
    from engine.models.registry import Registry
    from toyworld.judge import judge_clip, seam_steps
    from toyworld.world import parse_prompt

    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 't.db'}",
                                                  "engine.cache_dir": tmp_path / "cache", "worker.max_batch": 4})
    registry = Registry()
    assert registry.get("toy").chunk_condition == "clean"
    factory = session_factory(settings.database_url)
    manifest = tmp_path / "t.yaml"
    manifest.write_text("name: t\nmodel: toy\ndefaults: {duration_s: 4}\nvideos:\n" + "".join(
        f"  - {{id: v{i}, prompt: {prompt}, seed: {seed}}}\n" for i, (prompt, seed) in enumerate(TOY_LONG)))
    spec = load_manifest(manifest, registry=registry)
    assert {(v.frames, v.chunks, v.window) for v in spec.videos} == {(33, 5, 9)}
    submission.submit_run(factory, spec, output=f"file://{tmp_path / 'out'}/")
    engine = Engine(settings.engine_config(), registry)
    sizes = []
    while (result := render_next_batch(settings, engine, factory)).claimed:
        sizes.append(result.claimed)
    assert sizes == [4] * 5, "the four videos' chunks render together, chunk by chunk"
    seams = registry.get("toy").chunk_plan(33).seams()
    assert seams == [9, 15, 21, 27]
    windows = []
    for i, (prompt, _) in enumerate(TOY_LONG):
        frames = decode_frames((tmp_path / "out" / "t" / f"v{i}.mp4").read_bytes())
        assert frames.shape[0] == 33
        judged = [judge_clip(frames[start:start + 9]).matches(prompt) for start in range(0, 25, 6)]
        assert judged[0]["colour"] and judged[0]["direction"], (prompt, judged)
        windows += judged
        at_seams, inside = seam_steps(frames, seams, 2, parse_prompt(prompt)["direction"])
        assert at_seams.max() <= 1.5 * inside.max(), (prompt, at_seams, inside)
    assert all(w["colour"] for w in windows), windows
    assert sum(w["direction"] for w in windows) >= 0.9 * len(windows), windows
    # No seam step is over 3x its video's median step (the seam_jump check: measured 1.03-1.50 here, 0.77-2.30 on 72
    # held-out videos of 4 and 10 s, docs/LONG_VIDEOS.md), so none is flagged.
    with factory() as s:
        stored = s.scalars(select(Video).order_by(Video.id)).all()
    jumps = [json.loads(v.checks)["seam_jump"] for v in stored]
    assert all(j["passed"] and 0 < j["value"] <= 3.0 for j in jumps), jumps
    assert [v.flagged for v in stored] == [False] * 4


def test_a_last_chunk_whose_upload_outlived_its_worker_is_adopted_and_its_checkpoints_removed(farm, monkeypatch):
    """The worker stores the long video's MP4 and dies before recording it (the database write fails): the next
    attempt adopts the stored object by its recorded checksum instead of rendering again, and removes the chunks'
    checkpoints."""
    settings, factory, engine, out, _ = farm
    settings = settings.with_values({"limits.lease_s": 0.5})
    render_next_batch(settings, engine, factory)
    render_next_batch(settings, engine, factory)
    assert [u[2] for u in units(factory)[:3]] == [Status.SUCCEEDED, Status.SUCCEEDED, Status.PENDING]

    def dies(*args, **kwargs):
        raise ConnectionError("the worker died before recording")

    monkeypatch.setattr(record, "record_successes", dies)
    with pytest.raises(ConnectionError):
        render_next_batch(settings, engine, factory)
    monkeypatch.undo()
    stored = (out / "l" / "long.mp4").read_bytes()
    assert any((out / "_chunks").rglob("*.safetensors"))
    time.sleep(0.7)
    assert leases.reap_expired(factory, max_attempts=3) == {"tiny": 1}
    again = render_next_batch(settings, engine, factory)
    assert (again.claimed, again.succeeded) == (1, 1)
    with factory() as s:
        long = s.scalar(select(Video).where(Video.key == "long"))
    assert Status(long.status) is Status.SUCCEEDED and (out / "l" / "long.mp4").read_bytes() == stored
    assert not any((out / "_chunks").rglob("*.safetensors")), "the adopted video's checkpoints are removed too"
    assert long.poster_uri == (out / "l" / "long.jpg").as_uri(), "the adopted video has its poster"
