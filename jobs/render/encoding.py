"""How a batch's videos are encoded for the store: each video's MP4, checksum and poster (Encoded, encode_video), and
the steps run for each video of a batch, one after another or on a pool of store threads (StoreSteps, store_threads),
each timed on the meter's clock. jobs.render.store runs them and records what they come to."""

from __future__ import annotations

import contextvars
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from engine.engine import Engine
from engine.types import RenderedVideo
from jobs.claims.claims import ClaimedUnit
from jobs.render.checks import Checked
from jobs.settings import Settings
from storage.encode import encode_mp4
from storage.poster import poster_jpeg


@dataclass(frozen=True)
class Encoded:
    """Not an outcome yet: the video's MP4, its checksum (recorded before the upload) and its poster, to upload."""

    video: RenderedVideo
    data: bytes
    digest: str
    poster: bytes
    encode_s: float
    checked: Checked | None = None  # its checks (jobs.render.checks), stored with it


class StoreSteps:
    """One step run for each video of a batch: one after another, or on a pool of `threads`."""

    def __init__(self, threads: int):
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="reelbatch-store") if threads > 1 else None

    def __enter__(self) -> StoreSteps:
        return self

    def __exit__(self, *_exc) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def map(self, step: Callable, *columns: list) -> list:
        if self.pool is None:
            return [step(*args) for args in zip(*columns)]
        # Each on a copy of this thread's context, so its log lines keep the batch's bound fields (jobs.observe.logs).
        futures = [self.pool.submit(contextvars.copy_context().run, step, *args) for args in zip(*columns)]
        return [future.result() for future in futures]


def store_threads(settings: Settings, engine: Engine) -> int:
    """REELBATCH_STORE_THREADS, with `auto` (0) as 4 on an accelerator, whose host cores are idle while it renders,
    and 1 on a CPU, where the next batch renders on the same cores: there, 4 threads' encodes and database writes
    slowed the render they overlapped as much as they shortened the last batch's storing (docs/PERFORMANCE.md)."""
    if settings.worker.store_threads:
        return settings.worker.store_threads
    return 1 if engine.config.torch_device().type == "cpu" else 4


def timed(clock: Callable[[], float], step: Callable, *args) -> tuple:
    """The step's result and the seconds it took on `clock`."""
    start = clock()
    result = step(*args)
    return result, clock() - start


def encode_video(unit: ClaimedUnit, video: RenderedVideo) -> Encoded:
    start = time.perf_counter()
    enc = unit.encoding
    data = encode_mp4(video.frames, unit.fps, crf=enc.crf, codec=enc.codec, preset=enc.preset)
    poster = poster_jpeg(data)  # from the MP4's bytes, not the frames: jobs.render.posters says why
    return Encoded(video, data, hashlib.sha256(data).hexdigest(), poster, time.perf_counter() - start)
