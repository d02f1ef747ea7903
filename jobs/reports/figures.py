"""What a report states about a run's videos, counted once: the figures jobs.reports.summary turns into the report.

Two ways produce the same Figures: `figures` here, in Python over every video row (SQLite, the HTML report, the
tests' rows), and jobs.reports.postgres, by PostgreSQL over the run's rows (a 100,000-video run's rows took seconds
to bring into Python; docs/SCALE.md). What both must agree on is stated where each field is: the sums of floats in
id order (floating-point addition depends on its order), the lists of seconds in any order (only their percentiles
are reported), the reasons in a fixed order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from jobs.db.base import as_utc
from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.stats import ordered_sum

STAGES = ("text", "denoise", "decode", "encode", "upload")


@dataclass(frozen=True)
class Figures:
    counts: dict[str, int]  # videos by status, every status in Status's order
    succeeded: int
    total_micro: int  # every video's charges in micro-dollars, failed ones included
    video_seconds: float  # the successful videos' lengths added in id order (an int 0 with none, as sum() gives)
    first_start: datetime | None  # the earliest claim of any video
    last_finish: datetime | None  # the latest finish of a successful video
    failures: dict[str, int]  # failed videos by failure_reason, in the order of each reason's first video
    queue_waits: list[float]  # seconds from submission to first claim, one per claimed video, any order
    latencies: list[float]  # seconds from first claim to stored, one per successful video, any order
    stages_s: dict[str, float]  # the successful videos' seconds in each of STAGES, added in id order
    cancelled_by_reason: dict[str, int]  # videos reelbatch cancelled itself ("budget", "deadline"), by reason, sorted
    flagged: int = 0  # videos whose checks flagged them (jobs.render.checks)


def failure_reason(error: str | None) -> str:
    """A failed video's reason, for grouping: its error's class ("ObjectConflict", "RenderError", "lease expired")."""
    if not error:
        return "unknown"
    error = re.sub(r"^failed after \d+ attempts: ", "", error)
    head = error.split(":", 1)[0].strip()
    return head if len(head) <= 60 else head[:57] + "..."


def figures(run: Run, videos: list[tuple[Video, int]]) -> Figures:
    """The figures of `videos` (each with its cost in micro-dollars), in the order given (the database's: by id)."""
    counts = {s.value: 0 for s in Status}
    ok: list[Video] = []
    claimed: list[Video] = []
    failures: dict[str, int] = {}
    reasons: list[str] = []
    for v, _ in videos:
        status = Status(v.status)
        counts[status.value] += 1
        if v.started_at is not None:
            claimed.append(v)
        if status is Status.SUCCEEDED:
            ok.append(v)
        elif status is Status.FAILED:
            reason = failure_reason(v.last_error)
            failures[reason] = failures.get(reason, 0) + 1
        elif status is Status.CANCELLED and v.cancel_reason:
            reasons.append(v.cancel_reason)
    created = as_utc(run.created_at)
    return Figures(
        counts=counts, succeeded=len(ok), total_micro=sum(m for _, m in videos),
        video_seconds=ordered_sum(v.duration_s for v in ok),
        first_start=min((as_utc(v.started_at) for v in claimed), default=None),
        last_finish=max((as_utc(v.finished_at) for v in ok), default=None),
        failures=failures,
        queue_waits=[(as_utc(v.started_at) - created).total_seconds() for v in claimed],
        latencies=[(as_utc(v.finished_at) - as_utc(v.started_at)).total_seconds() for v in ok],
        stages_s={stage: ordered_sum(getattr(v, f"{stage}_s") or 0.0 for v in ok) for stage in STAGES},
        cancelled_by_reason={reason: reasons.count(reason) for reason in sorted(set(reasons))},
        flagged=sum(1 for v, _ in videos if v.flagged),
    )
