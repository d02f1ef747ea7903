"""One batch through the whole path: claim -> engine -> frames -> MP4 -> store -> rows and cost.

This is the plain function a Celery task calls; it joins jobs/, engine/ and storage/ and nothing else does.
Failures are sorted here: a retryable one (store or database unreachable, out of memory, a time limit) goes back to
pending with backoff until the video's attempts run out; a batch that fails is split so its videos retry one by one;
a permanent one (a different object at the video's key) fails the video at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache, partial

from engine.engine import Engine
from engine.errors import RenderInterrupted
from engine.types import RenderBatch, RenderedVideo, RenderRequest, Shape
from jobs.work import leases
from jobs.work import logs
from jobs.work import prometheus as metrics
from jobs.render.chunks import chunk_request, drop_checkpoints, stitch_long, store_chunk
from jobs.work.leases import Claim, ClaimedUnit, VideoOutput
from jobs.cost.ledger import Meter
from jobs.settings import Settings
from storage.encode import encode_mp4
from storage.stores import ObjectConflict, Store, StoreError, open_store

log = logging.getLogger(__name__)

# The reference for time limits: one Wan 480p, 81-frame, 50-step video with classifier-free guidance.
REFERENCE_WORK = 832 * 480 * 81 * 50 * 2


@dataclass(frozen=True)
class BatchResult:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    pending: int = 0  # handed to a Finisher to encode and store; its result arrives from Finisher.wait()


class Finisher:
    """Encodes, stores and records rendered batches on one background thread while the caller renders the next.

    Bounded: `submit` first waits for the batch before, so at most one finished batch is held in memory besides the
    one rendering. Video encoding (libx264) and uploads release the GIL, so they really do run beside the denoiser.
    Nothing is lost if the process dies with a batch here: its units are still leased, so the reaper hands them on,
    and an upload that completed is adopted by its recorded hash rather than made twice.
    """

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="reelbatch-finish")
        self._pending: Future | None = None

    def submit(self, job: Callable[[], BatchResult]) -> BatchResult | None:
        """Queue `job`; returns the result of the job it waited for, if any."""
        before = self.wait()
        self._pending = self._pool.submit(job)
        return before

    def wait(self) -> BatchResult | None:
        """Block until the queued job (if any) is done and return its result."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@lru_cache(maxsize=64)
def store_for(prefix: str) -> Store:
    return open_store(prefix)


def object_key(run_name: str, video_key: str) -> str:
    """Deterministic: the same video always lands on the same key, so a retry can never make a second object."""
    return f"{run_name}/{video_key}.mp4"


def batch_time_limit(settings: Settings, shape: Shape, videos: int) -> float:
    """The settings' limit for the reference video, scaled by this batch's work (pixels x frames x steps x CFG)."""
    work = shape.width * shape.height * shape.frames * shape.steps * (2 if shape.guidance > 1 else 1) * videos
    return max(settings.min_time_limit_s, settings.time_limit_s * work / REFERENCE_WORK)


def backoff(settings: Settings, attempts: int) -> float:
    return min(settings.retry_backoff_s * 2 ** max(attempts - 1, 0), 600.0)


def warm_up(settings: Settings, engine: Engine, factory, shapes: int = 4) -> list[str]:
    """Compile ahead: for each of the `shapes` shapes with the most work waiting, one denoising step of a batch the
    size the worker will claim, so its first real batch runs compiled code (a compile costs 15-25 s per shape on a
    CPU, more for a large model). Returns the shape keys warmed."""
    from jobs.db.queries import waiting_shapes

    warmed = []
    for shape, waiting in waiting_shapes(factory, shapes):
        size = min(settings.max_batch, waiting)
        requests = tuple(RenderRequest(-1 - i, "warm-up", None, i) for i in range(size))
        try:
            engine.render(RenderBatch(replace(shape, steps=1), requests))
        except Exception as exc:  # noqa: BLE001 - a shape that cannot render fails its own videos, not the worker
            log.warning("warm-up of %s failed: %s", shape.key(), exc)
            continue
        warmed.append(shape.key())
    return warmed


def render_next_batch(settings: Settings, engine: Engine, factory, finisher: Finisher | None = None,
                      on_ready: Callable[[int], None] | None = None, meter: Meter | None = None) -> BatchResult:
    """Claim one same-shape batch and take it to the store. A result with claimed=0 means nothing was waiting.

    With a `finisher`, encoding and storing are queued on it and the result says how many videos are `pending`;
    the leases are renewed until the finisher has recorded them. `on_ready(n)` is called (on whichever thread
    stores) when n long videos' next chunks have become claimable, so a worker can be told at once. `meter` is the
    worker's clock of paid time (jobs.cost.ledger); without one, charges carry no session.
    """
    meter = meter or Meter(settings.gpu_rate(), clock=time.perf_counter)
    claim = leases.claim_batch(factory, owner=worker_id(), max_batch=settings.max_batch, lease_s=settings.lease_s)
    if claim is None:
        return BatchResult()
    metrics.BATCH_SIZE.observe(len(claim.units))
    with logs.bound(runs=sorted({u.run_name for u in claim.units}), videos=[u.key for u in claim.units],
                    units=[u.unit_id for u in claim.units], shape=claim.batch.shape.key()):
        log.info("claimed %d (%s)", len(claim.units), claim.batch.shape.key())
        return _render_claim(settings, engine, factory, claim, finisher, on_ready, meter)


def _render_claim(settings, engine, factory, claim: Claim, finisher, on_ready, meter: Meter) -> BatchResult:
    limit = batch_time_limit(settings, claim.batch.shape, len(claim.units))
    keeper = LeaseKeeper(factory, claim, settings.lease_s, time.monotonic() + limit).__enter__()
    handed_off = False
    try:
        adopted, todo = _adopt_earlier_uploads(settings, factory, claim, meter)
        if not todo:
            return BatchResult(len(claim.units), adopted)
        try:
            with meter.busy(u.video_id for u in todo) as span:
                batch = RenderBatch(claim.batch.shape, tuple(
                    chunk_request(factory, store_for(u.output), r, u)
                    for r, u in zip(claim.batch.requests, claim.units) if u in todo))
                rendered = engine.render(batch, should_stop=keeper.should_stop)
        except RenderInterrupted as exc:
            return _interrupted(settings, factory, claim, todo, exc.reason, limit, adopted, meter,
                                span.seconds / len(todo))
        except Exception as exc:  # noqa: BLE001 - every failure of a batch is a failed attempt for its videos
            log.exception("batch of %d (%s) failed", len(todo), claim.batch.shape.key())
            return _retry_all(settings, factory, claim, todo, f"{type(exc).__name__}: {exc}", adopted, meter,
                              span.seconds / len(todo))
        # The batch's render time is shared equally: its videos have the same shape (frames x steps x pixels), so
        # the same work.
        render_share = span.seconds / len(todo)
        store = partial(_store_all, settings, factory, claim, todo, rendered, render_share, adopted, engine, on_ready,
                        meter)
        if finisher is None:
            return store()
        finisher.submit(partial(logs.current_context().run, _finish, store, keeper))
        handed_off = True
        return BatchResult(len(claim.units), pending=len(todo))
    finally:
        if not handed_off:
            keeper.__exit__(None, None, None)


def _finish(store: Callable[[], BatchResult], keeper: LeaseKeeper) -> BatchResult:
    try:
        return store()
    except Exception:  # noqa: BLE001 - e.g. the database restarting: the units stay leased until the reaper
        log.exception("finishing a batch failed; its videos will be retried after their leases expire")
        return BatchResult()
    finally:
        keeper.__exit__(None, None, None)


def _adopt_earlier_uploads(settings, factory, claim: Claim, meter: Meter) -> tuple[int, list[ClaimedUnit]]:
    """Videos whose earlier attempt uploaded but died before recording it: adopt the object, skip the render."""
    adopted, todo = 0, []
    for unit in claim.units:
        found = None
        if unit.upload_sha256:
            try:
                found = store_for(unit.output).stat(object_key(unit.run_name, unit.key))
            except StoreError:
                found = None  # the store will be asked again when this video is stored
        if found is not None and found.sha256 == unit.upload_sha256:
            out = VideoOutput(found.uri, found.bytes, found.sha256, 0.0, 0.0, 0.0)
            recorded = leases.record_success(factory, unit, out, meter.rate, settings.storage_price(),
                                             meter.session_id)
            adopted += recorded
            if recorded and unit.chunked:
                drop_checkpoints(factory, store_for(unit.output), unit)
        else:
            todo.append(unit)
    return adopted, todo


def _store_all(settings, factory, claim, todo, rendered, render_share, adopted, engine, on_ready,
               meter: Meter) -> BatchResult:
    """Store each rendered video (or checkpoint each chunk) and record it. Each is charged its render share plus the
    seconds its storing took that no render covered (jobs.cost.ledger)."""
    ok = retried = failed = readied = 0
    for unit, video in zip(todo, rendered):
        with meter.uncovered() as span:
            try:
                outcome, value = _store_one(factory, engine, claim, unit, video, settings)
            except ObjectConflict as exc:
                outcome, value = "conflict", f"ObjectConflict: {exc}"
            except Exception as exc:  # noqa: BLE001 - one video's store error must not fail its neighbours
                log.warning("storing %s (chunk %d) failed: %s", unit.key, unit.chunk, exc)
                outcome, value = "retry", f"{type(exc).__name__}: {exc}"
        spent = render_share + span.seconds
        if outcome == "conflict":
            lost = leases.record_failure(factory, unit, value, spent, meter.rate, meter.session_id)
            failed += lost
            metrics.VIDEOS.labels("failed").inc(lost)
        elif outcome == "retry":
            retried_now = _retry(settings, factory, unit, value, meter, spent=spent)
            retried += retried_now is True
            failed += retried_now is False
        elif outcome == "lost":
            # The lease was lost before the upload; whoever holds it now stores this video. A worker whose lease
            # was lost writes nothing, cost records included: its seconds stay on its session (jobs.cost.ledger).
            continue
        elif outcome == "chunk":
            readied += leases.record_chunk(factory, unit, value, render_share, video.stages, spent, meter.rate,
                                           meter.session_id)
            metrics.GPU_SECONDS.inc(spent)
        else:
            out = replace(value, render_s=render_share, charged=spent)
            recorded = leases.record_success(factory, unit, out, meter.rate, settings.storage_price(),
                                             meter.session_id)
            ok += recorded
            if recorded:
                _count_success(out)
                if unit.chunked:
                    drop_checkpoints(factory, store_for(unit.output), unit)
    if readied and on_ready is not None:
        on_ready(readied)
    if ok or failed:
        _results_if_done(factory, {u.run_name for u in todo})
    return BatchResult(len(claim.units), ok + adopted, retried, failed)


def _store_one(factory, engine, claim: Claim, unit: ClaimedUnit, video: RenderedVideo,
               settings: Settings) -> tuple[str, object]:
    """Encode and store one rendered video, or checkpoint one chunk. Returns ("video", its VideoOutput), ("chunk",
    the checkpoint's key), ("retry", an error) or ("lost", None) if its lease was lost. Raises what the store
    raised."""
    if video.error is None and unit.chunked and not unit.last_chunk:
        return "chunk", store_chunk(store_for(unit.output), unit, video.latents)
    if video.error is None and unit.chunked:
        try:
            video = stitch_long(factory, store_for(unit.output), engine, claim.batch.shape, unit, video)
        except Exception as exc:  # noqa: BLE001 - a checkpoint unreadable for now: the last chunk is retried
            log.warning("stitching %s failed: %s", unit.key, exc)
            return "retry", f"{type(exc).__name__}: {exc}"
    if video.error is not None:
        return "retry", video.error
    out = _store_video(factory, claim, unit, video.frames, video.stages, video.seam_score, settings.seam_review)
    return ("lost", None) if out is None else ("video", out)


def _results_if_done(factory, runs: set[str]) -> None:
    """The run's results.jsonl and errors.jsonl, once its last video is done (best effort: `reelbatch report RUN
    --results` writes them again)."""
    from jobs.reports.results import write_if_done

    for run in sorted(runs):
        try:
            write_if_done(factory, run)
        except Exception as exc:  # noqa: BLE001 - the videos are stored and recorded; only the summary is missing
            log.warning("could not write the result files of run %s: %s", run, exc)


def _retry(settings, factory, unit: ClaimedUnit, error: str, meter: Meter, *, solo: bool = False,
           spent: float = 0.0) -> bool | None:
    """A failed attempt, retried or failed; the `spent` seconds it took are charged to its video (kind "retry")."""
    outcome = leases.record_retry(factory, unit, error, max_attempts=settings.max_attempts,
                                  backoff_s=backoff(settings, unit.attempts), solo=solo, spent_s=spent,
                                  rate=meter.rate, session_id=meter.session_id)
    if outcome is not None:
        metrics.VIDEOS.labels("retried" if outcome else "failed").inc()
        metrics.GPU_SECONDS.inc(spent)
    return outcome


def _charge_cancelled(factory, unit: ClaimedUnit, spent: float, meter: Meter) -> None:
    """Charge the seconds a render spent before its run was cancelled (the release records no attempt)."""
    try:
        leases.record_charge(factory, unit.video_id, "cancelled", spent, meter.rate, meter.session_id)
    except Exception:  # noqa: BLE001 - the database is away: these seconds stay in the session's idle time
        log.warning("could not charge %.1f s to video %s", spent, unit.key, exc_info=True)
        return
    metrics.GPU_SECONDS.inc(spent)


def _count_success(out: VideoOutput) -> None:
    metrics.VIDEOS.labels("succeeded").inc()
    metrics.GPU_SECONDS.inc(out.charged_s)
    for stage, seconds in {**out.stages, "encode": out.encode_s, "upload": out.upload_s}.items():
        if seconds is not None:
            metrics.STAGE_SECONDS.labels(stage).observe(seconds)


def _retry_all(settings, factory, claim, todo, error: str, adopted: int, meter: Meter,
               spent: float = 0.0) -> BatchResult:
    # A batch of several that failed is split: each video retries alone, so one bad video cannot fail the rest.
    outcomes = [_retry(settings, factory, u, error, meter, solo=len(todo) > 1, spent=spent) for u in todo]
    return BatchResult(len(claim.units), adopted, outcomes.count(True), outcomes.count(False))


def _interrupted(settings, factory, claim, todo, reason: str, limit: float, adopted: int, meter: Meter,
                 spent: float = 0.0) -> BatchResult:
    if reason == "time limit":
        return _retry_all(settings, factory, claim, todo, f"batch time limit of {limit:.0f} s exceeded", adopted,
                          meter, spent)
    if reason == "lease lost":  # another worker owns these units now; every write from here would be refused
        return BatchResult(len(claim.units), adopted)
    for unit in todo:  # cancelled: the seconds were spent on these videos all the same
        _charge_cancelled(factory, unit, spent, meter)
    released = sum(leases.release(factory, u) for u in todo)  # cancelled runs' units become cancelled
    return BatchResult(len(claim.units), adopted, released=released)


def _store_video(factory, claim: Claim, unit: ClaimedUnit, frames, stages: dict[str, float],
                 seam_score: float | None = None, seam_review: float = float("inf")) -> VideoOutput | None:
    t0 = time.perf_counter()
    data = encode_mp4(frames, unit.fps)
    digest = hashlib.sha256(data).hexdigest()
    t1 = time.perf_counter()
    if not leases.mark_uploading(factory, unit, digest):
        return None  # the lease was lost: whoever holds it now stores this video
    stored = store_for(unit.output).put(
        object_key(unit.run_name, unit.key), data, sha256=digest, content_type="video/mp4",
        metadata={"run": unit.run_name, "id": unit.key, "seed": str(unit.seed), "model": claim.batch.shape.model},
    )
    t2 = time.perf_counter()
    return VideoOutput(stored.uri, stored.bytes, stored.sha256, 0.0, t1 - t0, t2 - t1, dict(stages),
                       seam_score, seam_score is not None and seam_score > seam_review)


class LeaseKeeper:
    """Renews a claim's leases in the background while it renders, and says when the render should stop.

    It stops renewing at the batch's deadline, so even a worker stuck inside a kernel loses its lease and the
    reaper hands the work to another worker.
    """

    def __init__(self, factory, claim: Claim, lease_s: float, deadline: float):
        self.factory, self.claim, self.lease_s, self.deadline = factory, claim, lease_s, deadline
        self.run_ids = {u.run_id for u in claim.units}
        self.lost = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-keeper", daemon=True)
        self._next_cancel_check = 0.0

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def _renew_loop(self) -> None:
        while not self._done.wait(self.lease_s / 3) and time.monotonic() < self.deadline:
            try:
                held = leases.renew(self.factory, self.claim.units, self.lease_s)
            except Exception:  # noqa: BLE001 - the database may be restarting; the next renewal tries again
                log.warning("lease renewal failed; retrying", exc_info=True)
                continue
            if len(held) < len(self.claim.units):
                self.lost = True
                return

    def should_stop(self) -> str | None:
        if self.lost:
            return "lease lost"
        now = time.monotonic()
        if now > self.deadline:
            return "time limit"
        if now >= self._next_cancel_check:  # at most once a second, however fast the steps are
            self._next_cancel_check = now + 1.0
            if leases.cancelled_runs(self.factory, self.run_ids):
                return "cancelled"
        return None
