"""A rendered batch to the store and the database: each video encoded (jobs.render.encoding), stored and recorded (or
each chunk of a long video checkpointed), each with its typed outcome, handled exhaustively. An object already at a
video's key that an earlier attempt of it stored is adopted (jobs.render.adopt)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from typing_extensions import TypeAlias, assert_never

from engine.engine import Engine
from engine.types import RenderedVideo
from faults import Decision
from jobs.claims.claims import Claim, ClaimedUnit
from jobs.cost.meter import Meter
from jobs.db.queries import Factory
from jobs.manifest import keys
from jobs.observe import prometheus
from jobs.render import record
from jobs.render.adopt import earlier_upload
from jobs.render.attempts import Attempt, count_success, decide, error_text, fail_now, retry, tally
from jobs.render.checks import Checked, ChecksFailed, check, record_refused
from jobs.render.chunks import drop_checkpoints, stitch_long, store_chunk
from jobs.render.encoding import Encoded, StoreSteps, encode_video, store_threads, timed
from jobs.render.finisher import BatchResult
from jobs.render.posters import adopted_poster, put_poster
from jobs.render.record import VideoOutput
from jobs.settings import Settings
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
class FailNow:
    """This attempt failed for a reason another attempt would meet again (another object at the video's key, a key
    too long for the store, blank frames): fail the video now."""

    error: str


@dataclass(frozen=True)
class LeaseLost:
    """The lease was taken over before the upload: whoever holds it now stores the video; write nothing."""


StoreOutcome: TypeAlias = Stored | Checkpointed | Retry | FailNow | LeaseLost | ChecksFailed


def store_all(settings: Settings, factory: Factory, claim: Claim, todo: list[ClaimedUnit],
              rendered: list[RenderedVideo], render_share: float, adopted: int, engine: Engine,
              on_ready: Callable[[int], None] | None, meter: Meter) -> BatchResult:
    """Store each rendered video (or checkpoint each chunk), then record the outcomes: failures, retries and chunks one
    by one, the successes together in one transaction (jobs.render.record.record_successes). Each is charged its render
    share plus the seconds of the batch's storing that no render covered (jobs.cost.meter), split between its videos
    in proportion to how long each one's storing took: one after another, that is each video's own uncovered time;
    on several threads at once, their overlapping seconds are charged once."""
    ok = readied = 0
    failures: list[Attempt] = []  # what each failed attempt came to
    with meter.uncovered() as span:
        attempts = _attempt_all(factory, engine, claim, todo, rendered, settings, meter.clock)
    own_total = sum(seconds for _, seconds in attempts)
    stored: list[tuple[ClaimedUnit, VideoOutput]] = []  # recorded together after the loop, in one transaction
    rendered_at = engine.pipelines.precision(claim.batch.shape.model)  # on each render's charge (engine.levers.precision)
    for unit, video, (outcome, seconds) in zip(todo, rendered, attempts):
        spent = render_share + (span.seconds * seconds / own_total if own_total > 0 else 0.0)
        match outcome:
            case FailNow(error):
                failures.append(fail_now(factory, unit, error, meter, spent=spent))
            case Retry(error):
                failures.append(retry(settings, factory, unit, error, meter, spent=spent))
            case LeaseLost():
                # Whoever holds the lease now stores this video. A worker whose lease was lost writes nothing,
                # cost records included: its seconds stay on its session (jobs.cost.ledger).
                continue
            case ChecksFailed() as refused:  # its run says retry (with the next seed) or fail
                again = record_refused(factory, unit, refused, spent, meter, settings.limits.max_attempts)
                failures.append(Attempt.LEASE_LOST if again is None else Attempt.RETRIED if again else Attempt.FAILED)
            case Checkpointed(key):
                readied += record.record_chunk(factory, unit, key, render_share, video.stages, spent, meter.rate,
                                               meter.session_id, rendered_at)
                prometheus.GPU_SECONDS.inc(spent)
            case Stored(out):
                stored.append((unit, replace(out, render_s=render_share, charged=spent,
                                             precision=rendered_at)))
            case _:
                assert_never(outcome)
    recorded = record.record_successes(factory, stored, meter.rate, settings.prices.storage, meter.session_id)
    for unit, out in stored:
        if recorded[unit.unit_id]:
            ok += 1
            if (first := count_success(out)) is not None:
                meter.record_cold_start(first)
            if unit.chunked:
                drop_checkpoints(factory, keys.store_for(unit.output), unit)
    if readied and on_ready is not None:
        on_ready(readied)
    return BatchResult(len(claim.units), ok + adopted, *tally(failures))


def _attempt_all(factory: Factory, engine: Engine, claim: Claim, todo: list[ClaimedUnit],
                 rendered: list[RenderedVideo], settings: Settings,
                 clock: Callable[[], float]) -> list[tuple[StoreOutcome, float]]:
    """Every video's attempt, in three steps for the batch: each video encoded (its MP4, checksum and poster) or, a
    long video's chunk, checkpointed; the checksums about to be stored recorded, all in one transaction; then each
    MP4 and its poster uploaded. One transaction where one per video made a batch of small previews wait on a commit
    each (docs/PERFORMANCE.md, "A batch's writes together").

    Encoding and uploading run on up to `store_threads(settings, engine)` threads at once: libx264, hashing and the
    store's writes (fsync, or an S3 request) release the GIL, so on a GPU's idle host cores a batch stores in a
    fraction of the time one after another takes. Each outcome comes with the seconds its steps took on `clock` (the
    meter's), the transaction's shared equally between the videos it marked."""
    with StoreSteps(min(store_threads(settings, engine), len(todo))) as steps:
        prepared = steps.map(partial(timed, clock, partial(_prepare, factory, engine, claim)), todo, rendered)
        ready = [(unit, step) for unit, (step, _) in zip(todo, prepared) if isinstance(step, Encoded)]
        marked, mark_s = timed(clock, _mark, factory, ready)
        share = mark_s / len(ready) if ready else 0.0
        going = [(unit, step) for unit, step in ready if marked[unit.unit_id] is None]
        uploads = steps.map(partial(timed, clock, partial(_upload, claim, share, settings.worker.seam_review)),
                            [unit for unit, _ in going], [step for _, step in going])
    uploaded = {unit.unit_id: upload for (unit, _), upload in zip(going, uploads)}
    outcomes: list[tuple[StoreOutcome, float]] = []
    for unit, (step, seconds) in zip(todo, prepared):
        if not isinstance(step, Encoded):
            outcomes.append((step, seconds))
        elif (refused := marked[unit.unit_id]) is not None:
            outcomes.append((refused, seconds + share))
        else:
            outcome, upload_s = uploaded[unit.unit_id]
            outcomes.append((outcome, seconds + share + upload_s))
    return outcomes


def _prepare(factory: Factory, engine: Engine, claim: Claim, unit: ClaimedUnit,
             video: RenderedVideo) -> StoreOutcome | Encoded:
    """Encode one rendered video, or checkpoint one chunk; whatever goes wrong is an outcome."""
    try:
        store = keys.store_for(unit.output)
        if video.error is None and unit.chunked and not unit.last_chunk:
            return Checkpointed(store_chunk(store, unit, video.latents))
        if video.error is None and unit.chunked:
            try:
                video = stitch_long(factory, store, engine, claim.batch.shape, unit, video)
            except Exception as exc:  # noqa: BLE001 - a checkpoint unreadable for now: the last chunk is retried
                log.warning("stitching %s failed: %s", unit.key, exc)
                return Retry(error_text(exc))
        if video.error is not None:  # the engine refused its frames (engine.frames.checks.checked)
            return _failed(unit, video.error)
        checked = check(factory, unit, video, engine.registry.get(claim.batch.shape.model).checks)
        if isinstance(checked, ChecksFailed):
            return checked
        return replace(encode_video(unit, video), checked=checked)
    except Exception as exc:  # noqa: BLE001 - one video's store error must not fail its neighbours
        return _failed(unit, exc)


def _mark(factory: Factory, ready: list[tuple[ClaimedUnit, Encoded]]) -> dict[int, StoreOutcome | None]:
    """Record, in one transaction, the checksum each video is about to store (jobs.render.record.mark_all_uploading):
    by unit id, None where the lease is held (upload it), LeaseLost where it is not; a Retry for each if the
    transaction fails."""
    if not ready:
        return {}
    try:
        held = record.mark_all_uploading(factory, [(unit, step.digest) for unit, step in ready])
    except Exception as exc:  # noqa: BLE001 - the database unreachable for now: each video is retried
        log.warning("recording the checksums of %d videos before their uploads failed: %s", len(ready), exc)
        return {unit.unit_id: Retry(error_text(exc)) for unit, _ in ready}
    return {unit.unit_id: None if unit.unit_id in held else LeaseLost() for unit, _ in ready}


def _upload(claim: Claim, mark_s: float, seam_review: float, unit: ClaimedUnit, step: Encoded) -> StoreOutcome:
    """Upload the MP4, then its poster (so a stored poster always has its video); `mark_s`, this video's share of
    recording the checksums, counts in its upload seconds."""
    start = time.perf_counter()
    model = claim.batch.shape.model
    try:
        try:
            stored = keys.store_for(unit.output).put(
                keys.object_key(unit.run_name, unit.key), step.data, sha256=step.digest, content_type="video/mp4",
                metadata={"run": unit.run_name, "id": unit.key, "seed": str(unit.seed), "model": model},
            )
            poster_uri = put_poster(unit, step.poster, model)
        except ObjectConflict:
            # The object at the key may be this video's own, from an earlier attempt whose upload landed after this
            # attempt found the key empty (a worker frozen past its lease, then thawed). Adopt it, as a retry adopts
            # an upload found at its claim.
            found = earlier_upload(unit)
            if found is None:
                raise
            log.warning("%s: adopting the MP4 an earlier attempt stored after this one rendered", unit.key)
            stored, poster_uri = found, adopted_poster(unit, model)
    except Exception as exc:  # noqa: BLE001 - one video's store error must not fail its neighbours
        return _failed(unit, exc)
    seams, checked = step.video.seam_score, step.checked or Checked(None, False, None)
    return Stored(VideoOutput(stored.uri, stored.bytes, stored.sha256, 0.0, step.encode_s,
                              mark_s + time.perf_counter() - start, dict(step.video.stages), seams,
                              seams is not None and seams > seam_review, poster_uri=poster_uri,
                              checks=checked.text, flagged=checked.flagged, checks_s=checked.seconds))


def _failed(unit: ClaimedUnit, exc: Exception) -> FailNow | Retry:
    """What an error while encoding or storing a video (or the engine's refusal of its frames) means for it, as the
    error decides (jobs.render.attempts.decide): another object at its key (not one an earlier attempt of this video
    stored: _upload adopts that), a key too long for the store or blank frames fail it now; an outage is retried."""
    where = f" (chunk {unit.chunk + 1} of {unit.chunks})" if unit.chunked else ""
    log.warning("storing %s%s failed: %s", unit.key, where, exc)
    match decide(exc):
        case Decision.FAIL_NOW:
            return FailNow(error_text(exc))
        case Decision.RETRY | Decision.HAND_BACK:  # handing back would render it again, for the same storing: retry
            return Retry(error_text(exc))
        case decision:
            assert_never(decision)
