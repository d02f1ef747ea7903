"""A run's report as plain data: what `report --json` prints and jobs.reports.text lays out for people.

Denominators count successful videos only (a failed video's cost stays in the total). Idle worker time is the run's
share of its workers' sessions (jobs.cost.ledger.run_ledger), shown on its own and included in the cost per video. Throughput is over the run's
active span: first claim to last stored video. Queue wait is submission to first claim; render latency is first claim
to stored object (a long video's spans all its chunks).
"""

from __future__ import annotations

import re

from jobs.cost.prices import Price
from jobs.db.rows import Run, Video, as_utc
from jobs.db.status import Status
from jobs.reports.stats import per_hour, percentiles, span_s

STAGES = ("text", "denoise", "decode", "encode", "upload")


def failure_reason(error: str | None) -> str:
    """A failed video's reason, for grouping: its error's class ("ObjectConflict", "RenderError", "lease expired")."""
    if not error:
        return "unknown"
    error = re.sub(r"^failed after \d+ attempts: ", "", error)
    head = error.split(":", 1)[0].strip()
    return head if len(head) <= 60 else head[:57] + "..."


def summary(run: Run, videos: list[tuple[Video, int]], price: Price | None = None, ledger: dict | None = None) -> dict:
    """`ledger`: the run's jobs.cost.ledger.run_ledger (idle share, charges by kind); without it, no idle time."""
    ok = [v for v, _ in videos if Status(v.status) is Status.SUCCEEDED]
    claimed = [v for v, _ in videos if v.started_at is not None]
    total_micro = sum(m for _, m in videos)
    video_seconds = sum(v.duration_s for v in ok)
    span = span_s((v.started_at for v in claimed), (v.finished_at for v in ok))
    failures: dict[str, int] = {}
    for v, _ in videos:
        if Status(v.status) is Status.FAILED:
            reason = failure_reason(v.last_error)
            failures[reason] = failures.get(reason, 0) + 1
    ledger = ledger or {}
    idle_usd = ledger.get("idle_usd", 0.0)
    with_idle = total_micro / 1e6 + idle_usd
    cost = {
        "total_usd": total_micro / 1e6,  # the videos' own charges, failed ones included
        "idle_usd": idle_usd, "idle_s": ledger.get("idle_s", 0.0),
        "by_kind_usd": {**ledger.get("by_kind_usd", {}), **({"idle": idle_usd} if idle_usd else {})},
        "total_with_idle_usd": with_idle,
        # Success-only denominators: failed videos' cost stays in the total.
        "per_successful_video_usd": (with_idle / len(ok)) if ok else None,
        "per_successful_video_excluding_idle_usd": (total_micro / len(ok) / 1e6) if ok else None,
        "per_video_second_usd": (with_idle / video_seconds) if video_seconds else None,
    }
    margin = None
    if price is not None and video_seconds:
        revenue = price.usd_per_video_s * video_seconds
        margin = {"price_per_video_second_usd": price.usd_per_video_s, "source": price.source,
                  "revenue_usd": revenue, "gross_margin": (revenue - with_idle) / revenue}
    return {
        "failures_by_reason": failures,
        "throughput": {"span_s": span, "videos_per_hour": per_hour(len(ok), span),
                       "video_seconds_per_hour": per_hour(video_seconds, span)},
        "queue_wait_s": percentiles([(as_utc(v.started_at) - as_utc(run.created_at)).total_seconds() for v in claimed]),
        "render_latency_s": percentiles([(as_utc(v.finished_at) - as_utc(v.started_at)).total_seconds() for v in ok]),
        "stages_s": {stage: sum(getattr(v, f"{stage}_s") or 0.0 for v in ok) for stage in STAGES},
        "cost": cost,
        "gross_margin": margin,
    }


def report_dict(run: Run, videos: list[tuple[Video, int]], price: Price | None = None,
                ledger: dict | None = None, listed: int | None = None) -> dict:
    """`listed`: give per-video entries only for the first `listed` videos and those with an error (what the text
    report shows; building 100,000 entries took it 1.5 s); None: every video."""
    counts = {s.value: 0 for s in Status}
    rows = []
    for i, (v, micro) in enumerate(videos):
        status = Status(v.status).value
        counts[status] += 1
        if listed is not None and i >= listed and not v.last_error:
            continue
        rows.append({
            "id": v.key, "status": status, "uri": v.uri, "poster_uri": v.poster_uri, "prompt": v.prompt,
            "seed": v.seed,
            "frames": v.frames, "fps": v.fps, "duration_s": v.duration_s, "width": v.width, "height": v.height,
            "steps": v.steps, "guidance": v.guidance, "bytes": v.bytes, "sha256": v.sha256,
            "attempts": v.attempts, "error": v.last_error,
            "render_s": v.render_s, "encode_s": v.encode_s, "upload_s": v.upload_s,
            "chunks": v.chunks, "seam_score": v.seam_score, "needs_review": v.needs_review,
            "cancel_reason": v.cancel_reason, "image": v.image_uri, "image_sha256": v.image_sha256, "fit": v.image_fit,
            "cost_usd": micro / 1e6,
        })
    extra = summary(run, videos, price, ledger)
    return {
        "run_id": run.id, "name": run.name, "model": run.model, "output": run.output, "priority": run.priority,
        "encoding": {"codec": run.codec, "crf": run.crf, "preset": run.preset}, "notify": run.notify_url,
        "source": run.source, "created_at": run.created_at.isoformat(), "counts": counts,
        "cost": extra.pop("cost"), **extra, **limits(run, videos),
        "videos": rows,
    }


def limits(run: Run, videos: list[tuple[Video, int]]) -> dict:
    """The run's cost cap and deadline, and what they did: when the cap stopped it, when it expired, and how many
    videos each cancelled."""
    reasons = [v.cancel_reason for v, _ in videos if Status(v.status) is Status.CANCELLED and v.cancel_reason]
    return {
        "max_cost_usd": run.max_cost_micro_usd / 1e6 if run.max_cost_micro_usd is not None else None,
        "budget_reached_at": _iso(run.budget_reached_at),
        "deadline": _iso(run.deadline), "expired": run.expired_at is not None, "expired_at": _iso(run.expired_at),
        "cancelled_by_reason": {reason: reasons.count(reason) for reason in sorted(set(reasons))},
    }


def _iso(moment) -> str | None:
    return as_utc(moment).isoformat() if moment else None
