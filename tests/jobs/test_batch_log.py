"""The worker's log line for each batch says what it stored: the real render path (tiny engine, PyAV, a local
folder), its log records read as the worker writes them."""

import logging

from sqlalchemy import select

from jobs.db.rows import Video
from jobs.db.status import Status
from jobs.render.batch import Finisher, render_next_batch
from jobs.render.stopping import Stopping

from .test_render import setup  # noqa: F401 - the fixture: three 2-step tiny videos of one shape


def batch_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "jobs.render.batch" and r.levelno == logging.INFO
            and r.getMessage().startswith("claimed ") and ":" in r.getMessage()]


def test_a_stored_batch_logs_its_stored_count(setup, caplog):  # noqa: F811
    settings, factory, engine, _ = setup
    caplog.set_level(logging.INFO, logger="jobs")
    render_next_batch(settings, engine, factory)
    assert batch_lines(caplog) == ["claimed 3: 3 stored, 0 failed, 0 to retry"]


def test_a_finisher_batch_logs_what_it_stored_when_it_has_stored_it(setup, caplog):  # noqa: F811
    """Handed to the finisher, a batch's line at its render says it is being stored (not `succeeded: 0`); the
    finisher's line, once stored, counts the stored videos."""
    settings, factory, engine, _ = setup
    caplog.set_level(logging.INFO, logger="jobs")
    settings = settings.with_values({"worker.max_batch": 2})
    finisher = Finisher()
    render_next_batch(settings, engine, factory, finisher)
    render_next_batch(settings, engine, factory, finisher)
    finisher.wait()
    assert batch_lines(caplog) == ["claimed 2: 2 rendered, storing beside the next render",
                                   "claimed 2: 2 stored, 0 failed, 0 to retry",
                                   "claimed 1: 1 rendered, storing beside the next render",
                                   "claimed 1: 1 stored, 0 failed, 0 to retry"]


def test_a_failed_store_of_a_one_chunk_video_names_no_chunk(setup, caplog):  # noqa: F811
    settings, factory, engine, folder = setup
    caplog.set_level(logging.INFO, logger="jobs")
    folder.mkdir(parents=True)
    (folder / "v1.mp4").write_bytes(b"somebody else's video")  # v1's key is taken: it fails at once
    render_next_batch(settings, engine, factory)
    assert batch_lines(caplog) == ["claimed 3: 2 stored, 1 failed, 0 to retry"]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "jobs.render.store"]
    assert warning.startswith("storing v1 failed: ") and "chunk" not in warning, warning
    with factory() as s:
        assert sorted(Status(v).value for v in s.scalars(select(Video.status))) == ["failed", "succeeded",
                                                                                      "succeeded"]


def test_the_batch_in_hand_is_told_once_per_denoising_step(setup):  # noqa: F811
    """Three 2-step videos in batches of at most 2: two batches, so 2 x 2 = 4 steps told, each batch then let go."""
    settings, factory, engine, _ = setup
    settings = settings.with_values({"worker.max_batch": 2})
    stopping = Stopping()
    told = []
    stopping.on_progress = lambda p: told.append(None if p is None else (p.videos, p.done, p.steps))
    while render_next_batch(settings, engine, factory, stopping=stopping).claimed:
        pass
    assert told == [(2, 1, 2), (2, 2, 2), None, (1, 1, 2), (1, 2, 2), None]
