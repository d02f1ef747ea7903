"""Every rendered video checked (engine.frames.video_checks) before it becomes an MP4, and what a failed check does, as
its
run's `checks.on_fail` says (jobs.manifest.checks):

- flag: the video is stored as usual, its checks with it, and marked flagged;
- retry: it goes back to pending with the next seed (next_seed) to render again once, this attempt's checks kept on
  its row and its seconds charged (kind "retry"); if the next render fails its checks too, it is stored and flagged.
  A long video is flagged instead: its earlier chunks' checkpoints are spent, and a new seed would need every chunk
  rendered again;
- fail: the video fails with the checks' reason (its checks kept, its seconds charged), and is not retried.

jobs.render.store calls `check` where a video's frames are about to be encoded, and records a ChecksFailed outcome
with `record_refused`; a stored video's checks go on its row with its success (jobs.render.record).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sqlalchemy import select

from engine.frames.video_checks import Thresholds, check_video
from engine.types import RenderedVideo
from jobs.claims.claims import ClaimedUnit
from jobs.claims.leases import fenced, retry_or_fail
from jobs.cost.meter import Meter
from jobs.cost.prices import charge
from jobs.db.queries import Factory
from jobs.db.rows import Video
from jobs.db.status import Status, move
from jobs.observe import prometheus

SEED_SPACE = 2**63  # a video's seed is a signed 64-bit integer (jobs.manifest.fields.MAX_SEED + 1 values)


def next_seed(seed: int) -> int:
    """The seed a retried video renders with: the next one, wrapping past the largest (2**63 - 1 -> 0). Plain and
    deterministic, so the second attempt is reproducible from the first's seed alone."""
    return (seed + 1) % SEED_SPACE


@dataclass(frozen=True)
class Checked:
    """A video's checks as they go on its row: JSON text (checks_json), whether they failed, and how long they took
    (None, with no text: not checked)."""

    text: str | None
    flagged: bool
    seconds: float | None


@dataclass(frozen=True)
class ChecksFailed:
    """A store outcome: the video's checks failed and its run says retry (`retry_seed` set) or fail (None)."""

    checked: Checked
    error: str
    retry_seed: int | None


def checks_json(seed: int, results: dict, passed: bool) -> str:
    """One attempt's checks as stored: its seed, whether all passed, and each check's value, limit and verdict.
    Keys sorted and json's default separators, so the text reads back to a dict that writes the same text (the
    PostgreSQL report passes the stored text on as it is: jobs.reports.postgres)."""
    return json.dumps({"seed": seed, "passed": passed, **results}, sort_keys=True)


def check(factory: Factory, unit: ClaimedUnit, video: RenderedVideo,
          thresholds: Thresholds) -> Checked | ChecksFailed:
    """The video's checks, and what they mean for it under its run's `on_fail`."""
    start = time.perf_counter()
    results = check_video(video.frames, thresholds, video.seam_score, video.noise_kept,
                          video.seam_jump)
    checked = Checked(checks_json(unit.seed, results.as_dict(), results.passed), not results.passed,
                      time.perf_counter() - start)
    if results.passed or unit.on_fail == "flag":
        return checked
    error = f"checks failed: {results.reason()}"
    if unit.on_fail == "fail":
        return ChecksFailed(checked, error, None)
    if unit.chunked or _retried_before(factory, unit):
        return checked  # retried once already (or a long video, which is not retried): stored and flagged
    return ChecksFailed(checked, error, next_seed(unit.seed))


def _retried_before(factory: Factory, unit: ClaimedUnit) -> bool:
    """Whether an earlier attempt's checks sent this video back already (their record is on its row)."""
    with factory() as s:
        return s.scalar(select(Video.checks).where(Video.id == unit.video_id)) is not None


def with_earlier(stored: str | None, latest: str | None) -> str | None:
    """The checks to store with a video: the latest attempt's, with the earlier attempts' (those a failed check sent
    back, newest first) under "earlier" (None: nothing checked, what is stored stays)."""
    if stored is None or latest is None:
        return latest if latest is not None else stored
    earlier = json.loads(stored)
    doc = json.loads(latest)
    doc["earlier"] = [{k: v for k, v in earlier.items() if k != "earlier"}, *earlier.get("earlier", [])]
    return json.dumps(doc, sort_keys=True)


def record_refused(factory: Factory, unit: ClaimedUnit, refused: ChecksFailed, spent: float, meter: Meter,
                   max_attempts: int) -> bool | None:
    """A video whose checks failed: back to pending with its next seed (True) or failed (False), its checks on its
    row and the `spent` seconds charged to it (kind "retry": an attempt that stored nothing). None: lease lost."""
    with factory.begin() as s:
        rows = fenced(s, unit)
        if rows is None:
            return None
        row, video = rows
        if spent > 0:
            s.add(charge(video.id, "retry", spent, meter.rate, meter.session_id))
        video.checks = with_earlier(video.checks, refused.checked.text)
        if refused.retry_seed is None:
            video.flagged = True
            row.last_error = video.last_error = refused.error[:4000]
            move(row, video, Status.FAILED)
            outcome = False
        else:
            video.seed = refused.retry_seed
            outcome = retry_or_fail(s, row, video, refused.error, max_attempts=max_attempts, not_before=None)
            video.flagged = not outcome  # out of attempts: failed, its checks the reason
    prometheus.VIDEOS.labels("retried" if outcome else "failed").inc()
    prometheus.GPU_SECONDS.inc(spent)
    return outcome
