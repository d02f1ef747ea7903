"""One batch through the whole path: claim -> engine -> frames -> MP4 -> store -> rows and cost.

This is the plain function a Celery task calls (jobs.work.tasks); with the modules beside it (store, record, chunks,
finisher, keeper), it is where jobs/, engine/ and storage/ meet. Failures are sorted by what each error decides
(jobs.render.attempts.decide): one that may pass (store or database unreachable, out of memory, a time limit, any
error reelbatch does not know) goes back to pending with backoff until the video's attempts run out; a batch that
fails is split so its videos retry one by one; one that another attempt would meet again (a render the engine
refuses, a different object at the video's key, a key too long for the store) fails the video at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial

import numpy as np
from typing_extensions import assert_never

from engine.engine import Engine
from engine.errors import RenderInterrupted
from engine.gates import UngatedSetting
from engine.types import RenderBatch, RenderRequest, Shape
from faults import Decision
from jobs.claims import claims, fair, leases
from jobs.claims.claims import Claim, ClaimedUnit, Serving, waiting_shapes
from jobs.claims.gate import Gate
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.manifest import keys
from jobs.notify.finished import run_finished
from jobs.observe import logs, prometheus
from jobs.observe.identity import worker_id
from jobs.render import record
from jobs.render.attempts import charge_released, decide, error_text, fail_now, retry, tally
from jobs.render.chunks import chunk_request, drop_checkpoints
from jobs.render.finisher import BatchResult, Finisher, finish
from jobs.render.images import attach_images
from jobs.render.keeper import LeaseKeeper, Stop
from jobs.render.posters import adopted_poster
from jobs.render.record import VideoOutput
from jobs.render.stopping import BatchProgress, Stopping
from jobs.render.store import earlier_upload, store_all
from jobs.settings import Settings
from storage.stores import StoreError

log = logging.getLogger(__name__)

# The reference for time limits: one Wan 480p, 81-frame, 50-step video with classifier-free guidance.
REFERENCE_WORK = 832 * 480 * 81 * 50 * 2


def batch_time_limit(settings: Settings, shape: Shape, videos: int) -> float:
    """The settings' limit for the reference video, scaled by this batch's work (pixels x frames x steps x CFG)."""
    work = shape.width * shape.height * shape.frames * shape.steps * (2 if shape.guidance > 1 else 1) * videos
    return max(settings.min_time_limit_s, settings.time_limit_s * work / REFERENCE_WORK)


def gated_models(engine: Engine, models: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Of `models`, those `engine` may render (every lever it would use on each, and a distilled registration
    itself, has a passing gate: engine.gates) and those it may not. A worker claims only the first; its session
    records the second, so `reelbatch status` can say why their work waits. Asked at each claim, so a gate recorded
    while the worker runs lets it take that model's work."""
    ok, ungated = [], []
    for model in models:
        try:
            engine.check_gate(model)
        except UngatedSetting:
            ungated.append(model)
        else:
            ok.append(model)
    return tuple(ok), tuple(ungated)


def serving(settings: Settings, engine: Engine) -> Serving:
    """What this worker claims (jobs.claims.claims.Serving): the models it serves whose gates passed
    (gated_models), their registrations' batch limits, and what its engine has warm."""
    registry = engine.registry
    models = gated_models(engine, settings.served_models(registry))[0]
    limits = {m: registry.get(m).max_batch for m in models if registry.get(m).max_batch}
    return Serving(models, limits, engine.loaded(), engine.last_shape, settings.affinity_s)


def warm_up(settings: Settings, engine: Engine, factory: Factory, shapes: int = 4) -> list[str]:
    """Compile ahead: for each of the `shapes` shapes with the most work waiting, one denoising step of a batch the
    size the worker will claim, so its first real batch runs compiled code (a compile costs 15-25 s per shape on a
    CPU, more for a large model). Returns the shape keys warmed."""
    warmed = []
    served = serving(settings, engine)
    for shape, waiting in waiting_shapes(factory, shapes, served.models):
        size = min(settings.max_batch, served.max_batch.get(shape.model, settings.max_batch), waiting)
        # A model that renders every video from an image warms up from a black one.
        image = None
        if shape.model in engine.registry and engine.registry.get(shape.model).image_condition == "pipeline":
            image = np.zeros((shape.height, shape.width, 3), dtype=np.uint8)
        requests = tuple(RenderRequest(-1 - i, "warm-up", None, i, image=image) for i in range(size))
        try:
            engine.render(RenderBatch(replace(shape, steps=1), requests))
        except Exception as exc:  # noqa: BLE001 - a shape that cannot render fails its own videos, not the worker
            log.warning("warm-up of %s failed: %s", shape.key(), exc)
            continue
        warmed.append(shape.key())
    return warmed


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
    meter = meter or Meter(settings.gpu_rate(), clock=time.perf_counter)
    if stopping is not None and not stopping.taking_work():
        return BatchResult()
    gate = Gate(meter.rate, settings.storage_price(), settings.cache_dir)
    claim = claims.claim_batch(factory, owner=worker_id(), max_batch=settings.max_batch, lease_s=settings.lease_s,
                               serving=serving(settings, engine), gate=gate,
                               fair=fair.shared() if settings.fair_share else None)
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
        if not result.pending:  # all recorded here (a finisher's batch notices when it has stored)
            _notice_finished(settings, factory, {u.run_name for u in claim.units})
        return result


def _render_claim(settings: Settings, engine: Engine, factory: Factory, claim: Claim, finisher: Finisher | None,
                  on_ready, meter: Meter, stopping: Stopping | None) -> BatchResult:
    limit = batch_time_limit(settings, claim.batch.shape, len(claim.units))
    with ExitStack() as held:
        keeper = held.enter_context(LeaseKeeper(factory, claim, settings.lease_s, time.monotonic() + limit,
                                                stopping))
        adopted, todo, unchecked = _adopt_earlier_uploads(settings, factory, claim, meter)
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
        except Exception as exc:  # noqa: BLE001 - a model that cannot load fails its videos' attempt, as a render would
            log.exception("loading %s failed", claim.batch.shape.model)
            return _with_unreadable(_failed_all(settings, factory, claim, todo, exc, adopted, meter), retried, failed)
        # The batch's time limit is for its render: a first batch's import and load (48 s for tiny on a loaded
        # 2-core machine, past the 60 s minimum with its render) no longer fails it.
        keeper.deadline = time.monotonic() + limit
        try:
            with meter.busy(u.video_id for u in todo) as span:
                batch = RenderBatch(claim.batch.shape, tuple(
                    chunk_request(factory, keys.store_for(u.output), r, u) for r, u in pairs))
                rendered = engine.render(batch, should_stop=keeper.should_stop)
        except RenderInterrupted as exc:
            return _interrupted(settings, factory, claim, todo, exc.reason, limit, adopted, meter,
                                span.seconds / len(todo))
        except Exception as exc:  # noqa: BLE001 - every failure of a batch is a failed attempt, as the error decides
            log.exception("batch of %d (%s) failed", len(todo), claim.batch.shape.key())
            return _failed_all(settings, factory, claim, todo, exc, adopted, meter, span.seconds / len(todo))
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
    _notice_finished(settings, factory, {u.run_name for u in claim.units})
    return result


def _notice_finished(settings: Settings, factory: Factory, runs: set[str]) -> None:
    """The runs this batch (or a budget) finished: their result files and webhooks (jobs.notify.finished)."""
    try:
        run_finished(settings, factory, runs)
    except Exception as exc:  # noqa: BLE001 - the videos are recorded; a sweeper's catch-up opens what is missed
        log.warning("noticing finished runs failed: %s", exc)


def _adopt_earlier_uploads(settings: Settings, factory: Factory, claim: Claim,
                           meter: Meter) -> tuple[int, list[ClaimedUnit], list[tuple[ClaimedUnit, str]]]:
    """Videos whose earlier attempt uploaded but died before recording it: adopt the object, skip the render.

    Returns how many were adopted, the units to render, and the units to retry without a render: those with an
    earlier checksum recorded whose key the store cannot be asked about now. Their earlier upload may have landed
    (its reply lost to the outage), and a new render can differ from it by a rounding (a batch of another size), so
    its bytes would then meet that object as a conflict and fail the video; the retry asks the store again."""
    adopted, todo, unchecked = 0, [], []
    for unit in claim.units:
        try:
            found = earlier_upload(unit)
        except StoreError as exc:
            log.warning("%s: cannot check its earlier upload, retried without a render: %s", unit.key, exc)
            unchecked.append((unit, error_text(exc)))
            continue
        if found is not None:
            out = VideoOutput(found.uri, found.bytes, found.sha256, 0.0, 0.0, 0.0,
                              poster_uri=adopted_poster(unit, claim.batch.shape.model))
            recorded = record.record_success(factory, unit, out, meter.rate, settings.storage_price(),
                                             meter.session_id)
            adopted += recorded
            if recorded and unit.chunked:
                drop_checkpoints(factory, keys.store_for(unit.output), unit)
        else:
            todo.append(unit)
    return adopted, todo, unchecked


def _failed_all(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit], exc: Exception,
                adopted: int, meter: Meter, spent: float = 0.0) -> BatchResult:
    """The batch's model would not load or its render raised: what follows for its videos is what the error decides.
    The `spent` seconds each video's share took are charged to it (kind "retry") whatever the decision."""
    error = error_text(exc)
    match decide(exc):
        case Decision.RETRY:
            return _retry_all(settings, factory, claim, todo, error, adopted, meter, spent)
        case Decision.FAIL_NOW if len(todo) > 1:
            # One video of several may be the cause (its picture, say): each goes back to be claimed alone, with no
            # attempt counted, and fails at once only if it fails alone (one attempt for each video, as it would
            # have spent alone).
            return _hand_back(factory, claim, todo, "retry", adopted, meter, spent, solo=True)
        case Decision.FAIL_NOW:
            (unit,) = todo
            _, failed = tally([fail_now(factory, unit, error, meter, spent=spent)])
            return BatchResult(len(claim.units), adopted, failed=failed)
        case Decision.HAND_BACK:  # stopped from outside (a RenderInterrupted is handled before: _interrupted)
            return _hand_back(factory, claim, todo, "interrupted", adopted, meter, spent)
        case decision:
            assert_never(decision)


def _retry_all(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit], error: str, adopted: int,
               meter: Meter, spent: float = 0.0) -> BatchResult:
    # A batch of several that failed is split: each video retries alone, so one bad video cannot fail the rest.
    retried, failed = tally(retry(settings, factory, u, error, meter, solo=len(todo) > 1, spent=spent) for u in todo)
    return BatchResult(len(claim.units), adopted, retried, failed)


def _hand_back(factory: Factory, claim: Claim, todo: list[ClaimedUnit], kind: str, adopted: int, meter: Meter,
               spent: float, *, solo: bool = False) -> BatchResult:
    """Give the units back with no attempt counted (`solo`: each to be claimed alone), charging each the `spent`
    seconds as `kind`."""
    for unit in todo:
        charge_released(factory, unit, kind, spent, meter)
    return BatchResult(len(claim.units), adopted, released=sum(leases.release(factory, u, solo=solo) for u in todo))


def _interrupted(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit], reason: Stop,
                 limit: float, adopted: int, meter: Meter, spent: float = 0.0) -> BatchResult:
    match reason:
        case Stop.TIME_LIMIT:
            return _retry_all(settings, factory, claim, todo, f"batch time limit of {limit:.0f} s exceeded",
                              adopted, meter, spent)
        case Stop.LEASE_LOST:  # another worker owns these units now; every write from here would be refused
            return BatchResult(len(claim.units), adopted)
        case Stop.CANCELLED | Stop.PREEMPTED | Stop.INTERRUPTED:
            # The seconds were spent on these videos all the same: charged as "cancelled", "preempted" or
            # "interrupted". The units go back at once, with no attempt counted (a cancelled run's become
            # cancelled), so another worker or a rerun takes them now rather than after their leases; a long
            # video keeps the chunks it finished.
            for unit in todo:
                charge_released(factory, unit, reason.value, spent, meter)
            released = sum(leases.release(factory, u) for u in todo)
            if reason is not Stop.CANCELLED:
                log.warning("stopped the batch of %d (%s): %d handed back", len(todo), reason.value, released)
            return BatchResult(len(claim.units), adopted, released=released)
        case _:
            assert_never(reason)
