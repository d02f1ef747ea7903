"""One batch through the whole path: claim -> engine -> frames -> MP4 -> store -> rows and cost.

This is the plain function a Celery task calls (jobs.work.tasks); with the modules beside it (serving before the
claim; store, record, chunks, finisher, keeper; failures after a batch that did not store), it is where jobs/, engine/
and storage/ meet. Failures are sorted by what each error decides (jobs.render.attempts.decide): one that may pass
(store or database unreachable, out of memory, a time limit, any error reelbatch does not know) goes back to pending
with backoff until the video's attempts run out; a batch that fails is split so its videos retry one by one; one that
another attempt would meet again (a render the engine refuses, a different object at the video's key, a key too long
for the store) fails the video at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial

import torch

from engine.engine import Engine
from engine.errors import RenderInterrupted, RetryableRenderError
from engine.types import RenderBatch, Shape
from jobs.claims import claims, fair
from jobs.claims.claims import Claim
from jobs.claims.gate import Gate
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.manifest import keys
from jobs.notify.finished import run_finished
from jobs.observe import logs, prometheus
from jobs.observe.identity import worker_id
from jobs.render import envelopes
from jobs.render.adopt import adopt_earlier_uploads
from jobs.render.attempts import retry, tally
from jobs.render.chunks import chunk_request
from jobs.render.failures import failed_all, interrupted
from jobs.render.finisher import BatchResult, Finisher, finish
from jobs.render.images import attach_images
from jobs.render.keeper import LeaseKeeper
from jobs.render.serving import batch_time_limit, serving
from jobs.render.stopping import BatchProgress, Stopping
from jobs.render.store import store_all
from jobs.settings import Settings

log = logging.getLogger(__name__)

def render_next_batch(settings: Settings, engine: Engine, factory: Factory, finisher: Finisher | None = None,
                      on_ready: Callable[[int, str], None] | None = None, meter: Meter | None = None,
                      stopping: Stopping | None = None) -> BatchResult:
    """Claim one same-shape batch and take it to the store. A result with claimed=0 means nothing was waiting, or
    the worker is shutting down (`stopping`, jobs.render.stopping: then nothing is claimed, and the batch stops at
    its next step when the worker must stop now or its grace cannot cover the rest).

    With a `finisher`, encoding and storing are queued on it and the result says how many videos are `pending`;
    the leases are renewed until the finisher has recorded them. `on_ready(n, model)` is called (on whichever thread
    stores) when n long videos' next chunks, of `model`, have become claimable, so a worker can be told at once.
    `meter` is the worker's clock of paid time (jobs.cost.meter); without one, charges carry no session.
    """
    meter = meter or Meter(settings.prices.gpu, clock=time.perf_counter)
    if stopping is not None and not stopping.taking_work():
        return BatchResult()
    gate = Gate(meter.rate, settings.prices.storage, settings.engine.cache_dir)
    claim = claims.claim_batch(factory, owner=worker_id(), max_batch=settings.worker.max_batch,
                               lease_s=settings.limits.lease_s, serving=serving(settings, engine, factory), gate=gate,
                               fair=fair.shared() if settings.worker.fair_share else None)
    if gate.stopped:  # a run stopped at its budget may have nothing left running to notice that it finished
        _notice_finished(settings, factory, set(gate.stopped))
    if claim is None:
        return BatchResult()
    prometheus.BATCH_SIZE.observe(len(claim.units))
    with logs.bound(runs=sorted({u.run_name for u in claim.units}), videos=[u.key for u in claim.units],
                    units=[u.unit_id for u in claim.units], shape=claim.batch.shape.key()):
        log.info("claimed %d (%s)", len(claim.units), claim.batch.shape.key())
        model = claim.batch.shape.model
        ready = None if on_ready is None else (lambda n: on_ready(n, model))
        result = _render_claim(settings, engine, factory, claim, finisher, ready, meter, stopping)
        log.info("%s", result.text())
        if not result.pending:  # all recorded here (a finisher's batch notices when it has stored)
            _notice_finished(settings, factory, {u.run_name for u in claim.units})
        return result


def _render_claim(settings: Settings, engine: Engine, factory: Factory, claim: Claim, finisher: Finisher | None,
                  on_ready, meter: Meter, stopping: Stopping | None) -> BatchResult:
    limit = batch_time_limit(settings, claim.batch.shape, len(claim.units))
    with ExitStack() as held:
        keeper = held.enter_context(LeaseKeeper(factory, claim, settings.limits.lease_s, time.monotonic() + limit,
                                                stopping))
        adopted, todo, unchecked = adopt_earlier_uploads(settings, factory, claim, meter)
        pairs, unreadable = attach_images(claim.batch.shape, [(r, u) for r, u in zip(claim.batch.requests,
                                                                                       claim.units) if u in todo])
        # An image that cannot be read or has changed is retried: it can be restored (its message says how).
        retried, failed = tally(retry(settings, factory, unit, error, meter) for unit, error in unchecked + unreadable)
        todo = [u for _, u in pairs]
        if not todo:
            return BatchResult(len(claim.units), adopted, retried, failed)
        progress = keeper.rendering(len(todo))
        try:
            # Loaded before the busy span: loading the model is the worker's idle time (jobs.cost.ledger), not the
            # first batch's, so what a video is charged (and estimated from: jobs.cost.estimate) is its render.
            engine.pipeline(claim.batch.shape.model)
            prometheus.cold_start("model_loaded")
        except Exception as exc:  # noqa: BLE001 - a model that cannot load fails its videos' attempt, as a render would
            log.exception("loading %s failed", claim.batch.shape.model)
            return _with_unreadable(failed_all(settings, factory, claim, todo, exc, adopted, meter), retried, failed)
        # The batch's time limit is for its render: a first batch's import and load (48 s for tiny on a loaded
        # 2-core machine, past the 60 s minimum with its render) no longer fails it.
        keeper.deadline = time.monotonic() + limit
        if stopping is not None and progress is not None:
            stopping.loaded(progress)  # the first step's time, which a Ctrl-C's estimate starts from, excludes it
        try:
            with meter.busy(u.video_id for u in todo) as span:
                batch = RenderBatch(claim.batch.shape, tuple(
                    chunk_request(factory, keys.store_for(u.output), r, u) for r, u in pairs))
                learnt = engine.max_batch.get(batch.shape.key())
                try:
                    rendered = engine.render(batch, should_stop=keeper.should_stop)
                except RetryableRenderError as exc:
                    if isinstance(exc.__cause__, torch.OutOfMemoryError):  # not even one fitted
                        _out_of_memory(settings, factory, engine, batch.shape, 1)
                    raise
                if engine.max_batch.get(batch.shape.key()) != learnt:  # it ran out of memory and split
                    _out_of_memory(settings, factory, engine, batch.shape, len(batch.requests))
        except RenderInterrupted as exc:
            return interrupted(settings, factory, claim, todo, exc.reason, limit, adopted, meter,
                               span.seconds / len(todo))
        except Exception as exc:  # noqa: BLE001 - every failure of a batch is a failed attempt, as the error decides
            log.exception("batch of %d (%s) failed", len(todo), claim.batch.shape.key())
            return failed_all(settings, factory, claim, todo, exc, adopted, meter, span.seconds / len(todo))
        # The batch's render time is shared equally: its videos have the same shape (frames x steps x pixels), so
        # the same work.
        store = partial(store_all, settings, factory, claim, todo, rendered, span.seconds / len(todo), adopted,
                        engine, on_ready, meter)
        if stopping is not None and progress is not None:
            stopping.rendered(progress)
            store = partial(_store_timed, store, stopping, progress)
        if finisher is None:
            return _with_unreadable(store(), retried, failed)
        # The finisher's thread stores the batch and then lets its leases go (the keeper leaves with it).
        finishing = partial(_then_notice, settings, factory, claim, store)
        finisher.submit(partial(logs.current_context().run, finish, finishing, held.pop_all()))
        return BatchResult(len(claim.units), retried=retried, failed=failed, pending=len(todo))


def _out_of_memory(settings: Settings, factory: Factory, engine: Engine, shape: Shape, videos: int) -> None:
    """`videos` of `shape` ran out of device memory: counted, and this device's envelope shrinks."""
    prometheus.OUT_OF_MEMORY.inc()
    if settings.worker.envelope != "off":
        envelopes.after_oom(settings, factory, engine.registry.get(shape.model), shape, videos)


def _with_unreadable(result: BatchResult, retried: int, failed: int) -> BatchResult:
    """A stored batch's result, counting the videos whose image failed before the render."""
    return replace(result, retried=result.retried + retried, failed=result.failed + failed)


def _store_timed(store: Callable[[], BatchResult], stopping: Stopping, progress: BatchProgress) -> BatchResult:
    """Store a batch, then note how long it took after its last step: the next batch's shutdown estimate."""
    result = store()
    stopping.recorded(progress)
    return result


def _then_notice(settings: Settings, factory: Factory, claim: Claim, store: Callable[[], BatchResult]) -> BatchResult:
    result = store()
    log.info("%s", result.text())
    _notice_finished(settings, factory, {u.run_name for u in claim.units})
    return result


def _notice_finished(settings: Settings, factory: Factory, runs: set[str]) -> None:
    """The runs this batch (or a budget) finished: their result files and webhooks (jobs.notify.finished)."""
    try:
        run_finished(settings, factory, runs)
    except Exception as exc:  # noqa: BLE001 - the videos are recorded; a sweeper's catch-up opens what is missed
        log.warning("noticing finished runs failed: %s", exc)
