"""One batch through the whole path: claim -> engine -> frames -> MP4 -> store -> rows and cost.

This is the plain function a Celery task calls; it joins jobs/, engine/ and storage/ and nothing else does.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from functools import lru_cache

from engine.engine import Engine
from jobs import queries
from jobs.queries import Claim, ClaimedUnit, Rate, VideoOutput
from jobs.settings import Settings
from storage.encode import encode_mp4
from storage.stores import Store, open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchResult:
    claimed: int
    succeeded: int
    failed: int


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@lru_cache(maxsize=64)
def store_for(prefix: str) -> Store:
    return open_store(prefix)


def object_key(run_name: str, video_key: str) -> str:
    """Deterministic: the same video always lands on the same key, so a retry can never make a second object."""
    return f"{run_name}/{video_key}.mp4"


def render_next_batch(settings: Settings, engine: Engine, factory) -> BatchResult:
    claim = queries.claim_batch(factory, owner=worker_id(), max_batch=settings.max_batch,
                                lease_s=settings.lease_s)
    if claim is None:
        return BatchResult(0, 0, 0)
    rate = Rate(settings.gpu_hour_usd, settings.gpu_hour_source)
    started = time.perf_counter()
    try:
        rendered = engine.render(claim.batch)
    except Exception as exc:  # noqa: BLE001 - every video of the batch gets the error; retries come with leases
        log.exception("batch of %d failed", len(claim.units))
        error = f"{type(exc).__name__}: {exc}"
        for unit in claim.units:
            queries.record_failure(factory, unit, error)
        return BatchResult(len(claim.units), 0, len(claim.units))
    # The batch's render time is shared equally: its videos have the same shape, so the same work.
    render_share = (time.perf_counter() - started) / len(claim.units)
    ok = failed = 0
    for unit, video in zip(claim.units, rendered):
        if video.error is None:
            try:
                out = _store_video(claim, unit, video.frames, render_share)
            except Exception as exc:  # noqa: BLE001 - one video's store error must not fail its neighbours
                log.exception("storing video %s failed", unit.key)
                video_error = f"{type(exc).__name__}: {exc}"
            else:
                ok += queries.record_success(factory, unit, out, rate)
                continue
        else:
            video_error = video.error
        failed += queries.record_failure(factory, unit, video_error)
    return BatchResult(len(claim.units), ok, failed)


def _store_video(claim: Claim, unit: ClaimedUnit, frames, render_share: float) -> VideoOutput:
    t0 = time.perf_counter()
    data = encode_mp4(frames, unit.fps)
    digest = hashlib.sha256(data).hexdigest()
    t1 = time.perf_counter()
    store = store_for(unit.output)
    stored = store.put(
        object_key(unit.run_name, unit.key), data, sha256=digest, content_type="video/mp4",
        metadata={"run": unit.run_name, "id": unit.key, "seed": str(unit.seed), "model": claim.batch.shape.model},
    )
    t2 = time.perf_counter()
    return VideoOutput(stored.uri, stored.bytes, stored.sha256, render_share, t1 - t0, t2 - t1)
