"""A run's report as plain data: what `report --json` prints and jobs.reports.text lays out for people.

Denominators count successful videos only (a failed video's cost stays in the total). Idle worker time is the run's
share of its workers' sessions (jobs.cost.ledger.run_ledger), shown on its own and included in the cost per video.
Throughput is over the run's active span: first claim to last stored video. Queue wait is submission to first claim;
render latency is first claim to stored object (a long video's spans all its chunks).

The figures come from jobs.reports.figures (Python over the rows) or jobs.reports.postgres (PostgreSQL over them);
everything here is the same for both.
"""

from __future__ import annotations

import json

from jobs.cost.prices import Price
from jobs.db.base import as_utc
from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.figures import STAGES, Figures, failure_reason, figures
from jobs.reports.stats import per_hour, percentiles, span_s

__all__ = ["STAGES", "entry", "failure_reason", "report_dict", "report_of", "summary", "summary_of"]


def summary(run: Run, videos: list[tuple[Video, int]], price: Price | None = None, ledger: dict | None = None) -> dict:
    """`ledger`: the run's jobs.cost.ledger.run_ledger (idle share, charges by kind); without it, no idle time."""
    return summary_of(figures(run, videos), price, ledger)


def summary_of(f: Figures, price: Price | None = None, ledger: dict | None = None) -> dict:
    span = span_s([f.first_start] if f.first_start else [], [f.last_finish] if f.last_finish else [])
    ledger = ledger or {}
    idle_usd = ledger.get("idle_usd", 0.0)
    with_idle = f.total_micro / 1e6 + idle_usd
    cost = {
        "total_usd": f.total_micro / 1e6,  # the videos' own charges, failed ones included
        "idle_usd": idle_usd, "idle_s": ledger.get("idle_s", 0.0),
        "by_kind_usd": {**ledger.get("by_kind_usd", {}), **({"idle": idle_usd} if idle_usd else {})},
        "total_with_idle_usd": with_idle,
        # Success-only denominators: failed videos' cost stays in the total.
        "per_successful_video_usd": (with_idle / f.succeeded) if f.succeeded else None,
        "per_successful_video_excluding_idle_usd": (f.total_micro / f.succeeded / 1e6) if f.succeeded else None,
        "per_video_second_usd": (with_idle / f.video_seconds) if f.video_seconds else None,
    }
    margin = None
    if price is not None and f.video_seconds:
        revenue = price.usd_per_video_s * f.video_seconds
        margin = {"price_per_video_second_usd": price.usd_per_video_s, "source": price.source,
                  "revenue_usd": revenue, "gross_margin": (revenue - with_idle) / revenue}
    return {
        "failures_by_reason": f.failures,
        "throughput": {"span_s": span, "videos_per_hour": per_hour(f.succeeded, span),
                       "video_seconds_per_hour": per_hour(f.video_seconds, span)},
        "queue_wait_s": percentiles(f.queue_waits),
        "render_latency_s": percentiles(f.latencies),
        "stages_s": f.stages_s,
        "cost": cost,
        "gross_margin": margin,
    }


def entry(v: Video, micro: int) -> dict:
    """One video's entry in the report (jobs.reports.postgres writes the same keys, in this order, as JSON text)."""
    return {
        "id": v.key, "status": Status(v.status).value, "uri": v.uri, "poster_uri": v.poster_uri, "prompt": v.prompt,
        "seed": v.seed,
        "frames": v.frames, "fps": v.fps, "duration_s": v.duration_s, "width": v.width, "height": v.height,
        "steps": v.steps, "guidance": v.guidance, "bytes": v.bytes, "sha256": v.sha256,
        "attempts": v.attempts, "error": v.last_error,
        "render_s": v.render_s, "encode_s": v.encode_s, "upload_s": v.upload_s,
        "chunks": v.chunks, "seam_score": v.seam_score, "needs_review": v.needs_review,
        "cancel_reason": v.cancel_reason, "image": v.image_uri, "image_sha256": v.image_sha256, "fit": v.image_fit,
        # Its checks (jobs.render.checks), as stored; flagged when a stored (or failed) video failed one.
        "flagged": v.flagged, "checks": json.loads(v.checks) if v.checks else None,
        "cost_usd": micro / 1e6,
    }


def report_dict(run: Run, videos: list[tuple[Video, int]], price: Price | None = None,
                ledger: dict | None = None, listed: int | None = None) -> dict:
    """`listed`: give per-video entries only for the first `listed` videos and those with an error or flagged (what
    the text report shows; building 100,000 entries took it 1.5 s); None: every video."""
    rows = [entry(v, micro) for i, (v, micro) in enumerate(videos)
            if listed is None or i < listed or v.last_error or v.flagged]
    return report_of(run, figures(run, videos), rows, price, ledger)


def report_of(run: Run, f: Figures, rows: list[dict], price: Price | None = None, ledger: dict | None = None) -> dict:
    """The report from its figures and the entries of the videos it lists ("videos" is its last key)."""
    extra = summary_of(f, price, ledger)
    return {
        "run_id": run.id, "name": run.name, "model": run.model, "output": run.output, "priority": run.priority,
        "encoding": {"codec": run.codec, "crf": run.crf, "preset": run.preset}, "notify": run.notify_url,
        "source": run.source, "created_at": run.created_at.isoformat(), "counts": f.counts,
        "cost": extra.pop("cost"), **extra, **limits(run, f),
        "checks": {"on_fail": run.checks_on_fail, "flagged": f.flagged},
        "videos": rows,
    }


def limits(run: Run, f: Figures) -> dict:
    """The run's cost cap and deadline, and what they did: when the cap stopped it, when it expired, and how many
    videos each cancelled."""
    return {
        "max_cost_usd": run.max_cost_micro_usd / 1e6 if run.max_cost_micro_usd is not None else None,
        "budget_reached_at": _iso(run.budget_reached_at),
        "deadline": _iso(run.deadline), "expired": run.expired_at is not None, "expired_at": _iso(run.expired_at),
        "cancelled_by_reason": f.cancelled_by_reason,
    }


def _iso(moment) -> str | None:
    return as_utc(moment).isoformat() if moment else None
