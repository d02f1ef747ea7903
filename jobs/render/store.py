"""A rendered batch to the store and the database: each video encoded, stored and recorded (or each chunk of a long
video checkpointed), each with its typed outcome, handled exhaustively."""

from __future__ import annotations

import contextvars
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

from typing_extensions import assert_never

from engine.engine import Engine
from engine.types import RenderedVideo
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.render import keys, record
from jobs.render.attempts import count_success, retry
from jobs.render.chunks import drop_checkpoints, stitch_long, store_chunk
from jobs.render.finisher import BatchResult
from jobs.render.posters import put_poster
from jobs.render.record import VideoOutput
from jobs.settings import Settings
from jobs.work import prometheus
from jobs.work.claims import Claim, ClaimedUnit
from storage.encode import encode_mp4
from storage.poster import poster_jpeg
from storage.stores import ObjectConflict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stored:
    """The video's MP4 is in the store: record its success."""

    out: VideoOutput


@dataclass(frozen=True)
class Checkpointed:
    """A long video's chunk (not its last): its latents are checkpointed at `key`; the next chunk may start."""

    key: str


@dataclass(frozen=True)
class Retry:
    """This attempt failed for a reason that may pass: retry the video after a backoff."""

    error: str


@dataclass(frozen=True)
class Conflict:
    """Another object is at the video's key: fail it now (retrying cannot help)."""

    error: str


@dataclass(frozen=True)
class LeaseLost:
    """The lease was taken over before the upload: whoever holds it now stores the video; write nothing."""


StoreOutcome = Stored | Checkpointed | Retry | Conflict | LeaseLost


def store_all(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit],
              rendered: list[RenderedVideo], render_share: float, adopted: int, engine: Engine,
              on_ready: Callable[[int], None] | None, meter: Meter) -> BatchResult:
    """Store each rendered video (or checkpoint each chunk), then record the outcomes: failures, retries and chunks one
    by one, the successes together in one transaction (jobs.render.record.record_successes). Each is charged its render
    share plus the seconds of the batch's storing that no render covered (jobs.cost.meter), split between its videos
    in proportion to how long each one's storing took: one after another, that is each video's own uncovered time;
    on several threads at once, their overlapping seconds are charged once."""
    ok = retried = failed = readied = 0
    with meter.uncovered() as span:
        attempts = _attempt_all(factory, engine, claim, todo, rendered, settings, meter.clock)
    own_total = sum(seconds for _, seconds in attempts)
    stored: list[tuple[ClaimedUnit, VideoOutput]] = []  # recorded together after the loop, in one transaction
    for unit, video, (outcome, seconds) in zip(todo, rendered, attempts):
        spent = render_share + (span.seconds * seconds / own_total if own_total > 0 else 0.0)
        match outcome:
            case Conflict(error):
                lost = record.record_failure(factory, unit, error, spent, meter.rate, meter.session_id)
                failed += lost
                prometheus.VIDEOS.labels("failed").inc(lost)
            case Retry(error):
                retried_now = retry(settings, factory, unit, error, meter, spent=spent)
                retried += retried_now is True
                failed += retried_now is False
            case LeaseLost():
                # Whoever holds the lease now stores this video. A worker whose lease was lost writes nothing,
                # cost records included: its seconds stay on its session (jobs.cost.ledger).
                continue
            case Checkpointed(key):
                readied += record.record_chunk(factory, unit, key, render_share, video.stages, spent, meter.rate,
                                               meter.session_id)
                prometheus.GPU_SECONDS.inc(spent)
            case Stored(out):
                stored.append((unit, replace(out, render_s=render_share, charged=spent)))
            case _:
                assert_never(outcome)
    recorded = record.record_successes(factory, stored, meter.rate, settings.storage_price(), meter.session_id)
    for unit, out in stored:
        if recorded[unit.unit_id]:
            ok += 1
            count_success(out)
            if unit.chunked:
                drop_checkpoints(factory, keys.store_for(unit.output), unit)
    if readied and on_ready is not None:
        on_ready(readied)
    return BatchResult(len(claim.units), ok + adopted, retried, failed)


def _attempt_all(factory: Factory, engine: Engine, claim: Claim, todo: list[ClaimedUnit],
                 rendered: list[RenderedVideo], settings: Settings,
                 clock: Callable[[], float]) -> list[tuple[StoreOutcome, float]]:
    """Every video's attempt, on up to `store_threads(settings, engine)` threads at once. Encoding (libx264), hashing
    and the store's writes (fsync, or an S3 request) release the GIL, so a batch of small previews stores in a
    fraction of the time one after another took: the tail after a worker's last render, and what bounds its rate
    once the denoiser renders faster than one thread stores (docs/PERFORMANCE.md, "Storing on several threads").
    Each outcome comes with the seconds its attempt took on `clock` (the meter's)."""
    attempt = partial(_timed_attempt, factory, engine, claim, settings=settings, clock=clock)
    threads = min(store_threads(settings, engine), len(todo))
    if threads <= 1:
        return [attempt(unit, video) for unit, video in zip(todo, rendered)]
    with ThreadPoolExecutor(threads, thread_name_prefix="reelbatch-store") as pool:
        # Each on a copy of this thread's context, so its log lines keep the batch's bound fields (jobs.work.logs).
        futures = [pool.submit(contextvars.copy_context().run, attempt, unit, video)
                   for unit, video in zip(todo, rendered)]
        return [future.result() for future in futures]


def store_threads(settings: Settings, engine: Engine) -> int:
    """REELBATCH_STORE_THREADS, with `auto` (0) as 4 on an accelerator, whose host cores are idle while it renders,
    and 1 on a CPU, where the next batch renders on the same cores: there, 4 threads' encodes and database writes
    slowed the render they overlapped as much as they shortened the last batch's storing (docs/PERFORMANCE.md)."""
    if settings.store_threads:
        return settings.store_threads
    return 1 if engine.config.torch_device().type == "cpu" else 4


def _timed_attempt(factory: Factory, engine: Engine, claim: Claim, unit: ClaimedUnit, video: RenderedVideo,
                   settings: Settings, clock: Callable[[], float]) -> tuple[StoreOutcome, float]:
    start = clock()
    outcome = _attempt(factory, engine, claim, unit, video, settings)
    return outcome, clock() - start


def _attempt(factory: Factory, engine: Engine, claim: Claim, unit: ClaimedUnit, video: RenderedVideo,
             settings: Settings) -> StoreOutcome:
    """Encode and store one rendered video, or checkpoint one chunk; whatever goes wrong is an outcome."""
    try:
        return _store_one(factory, engine, claim, unit, video, settings)
    except ObjectConflict as exc:
        return Conflict(f"ObjectConflict: {exc}")
    except Exception as exc:  # noqa: BLE001 - one video's store error must not fail its neighbours
        log.warning("storing %s (chunk %d) failed: %s", unit.key, unit.chunk, exc)
        return Retry(f"{type(exc).__name__}: {exc}")


def _store_one(factory: Factory, engine: Engine, claim: Claim, unit: ClaimedUnit, video: RenderedVideo,
               settings: Settings) -> StoreOutcome:
    store = keys.store_for(unit.output)
    if video.error is None and unit.chunked and not unit.last_chunk:
        return Checkpointed(store_chunk(store, unit, video.latents))
    if video.error is None and unit.chunked:
        try:
            video = stitch_long(factory, store, engine, claim.batch.shape, unit, video)
        except Exception as exc:  # noqa: BLE001 - a checkpoint unreadable for now: the last chunk is retried
            log.warning("stitching %s failed: %s", unit.key, exc)
            return Retry(f"{type(exc).__name__}: {exc}")
    if video.error is not None:
        return Retry(video.error)
    out = _store_video(factory, claim, unit, video, settings.seam_review)
    return LeaseLost() if out is None else Stored(out)


def _store_video(factory: Factory, claim: Claim, unit: ClaimedUnit, video: RenderedVideo,
                 seam_review: float) -> VideoOutput | None:
    """Encode the frames, record the checksum about to be stored (fenced), upload the MP4 and then its poster; None
    if the lease was lost."""
    t0 = time.perf_counter()
    enc = unit.encoding
    data = encode_mp4(video.frames, unit.fps, crf=enc.crf, codec=enc.codec, preset=enc.preset)
    digest = hashlib.sha256(data).hexdigest()
    poster = poster_jpeg(data)  # from the MP4's bytes, not the frames: jobs.render.posters says why
    t1 = time.perf_counter()
    if not record.mark_uploading(factory, unit, digest):
        return None
    model = claim.batch.shape.model
    stored = keys.store_for(unit.output).put(
        keys.object_key(unit.run_name, unit.key), data, sha256=digest, content_type="video/mp4",
        metadata={"run": unit.run_name, "id": unit.key, "seed": str(unit.seed), "model": model},
    )
    poster_uri = put_poster(unit, poster, model)  # after the MP4, so a stored poster always has its video
    t2 = time.perf_counter()
    seams = video.seam_score
    return VideoOutput(stored.uri, stored.bytes, stored.sha256, 0.0, t1 - t0, t2 - t1, dict(video.stages),
                       seams, seams is not None and seams > seam_review, poster_uri=poster_uri)
