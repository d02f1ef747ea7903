"""A run's report as plain data (for --json) and as a table (for people).

Denominators count successful videos only (a failed video's cost stays in the total). Idle worker time is the run's
share of its workers' sessions (jobs.cost.ledger.run_ledger), shown on its own and included in the cost per video. Throughput is over the run's
active span: first claim to last stored video. Queue wait is submission to first claim; render latency is first claim
to stored object (a long video's spans all its chunks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from rich.console import Console
from rich.table import Table

from jobs.db.rows import Run, Video
from jobs.db.status import Status

STAGES = ("text", "denoise", "decode", "encode", "upload")


@dataclass(frozen=True)
class Price:
    """What a video-second sells for, to compute gross margin against (a setting, with its source)."""

    usd_per_video_s: float
    source: str


def failure_reason(error: str | None) -> str:
    """A failed video's reason, for grouping: its error's class ("ObjectConflict", "RenderError", "lease expired")."""
    if not error:
        return "unknown"
    error = re.sub(r"^failed after \d+ attempts: ", "", error)
    head = error.split(":", 1)[0].strip()
    return head if len(head) <= 60 else head[:57] + "..."


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {q: float(np.percentile(values, int(q[1:]))) for q in ("p50", "p95", "p99")} | {"max": float(max(values))}


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def summary(run: Run, videos: list[tuple[Video, int]], price: Price | None = None, ledger: dict | None = None) -> dict:
    """`ledger`: the run's jobs.cost.ledger.run_ledger (idle share, charges by kind); without it, no idle time."""
    ok = [v for v, _ in videos if Status(v.status) is Status.SUCCEEDED]
    claimed = [v for v, _ in videos if v.started_at is not None]
    total_micro = sum(m for _, m in videos)
    video_seconds = sum(v.duration_s for v in ok)
    span = ((max(_utc(v.finished_at) for v in ok) - min(_utc(v.started_at) for v in claimed)).total_seconds()
            if ok and claimed else 0.0)
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
        "throughput": {"span_s": span, "videos_per_hour": 3600 * len(ok) / span if span else None,
                       "video_seconds_per_hour": 3600 * video_seconds / span if span else None},
        "queue_wait_s": _percentiles([(_utc(v.started_at) - _utc(run.created_at)).total_seconds() for v in claimed]),
        "render_latency_s": _percentiles([(_utc(v.finished_at) - _utc(v.started_at)).total_seconds() for v in ok]),
        "stages_s": {stage: sum(getattr(v, f"{stage}_s") or 0.0 for v in ok) for stage in STAGES},
        "cost": cost,
        "gross_margin": margin,
    }


def report_dict(run: Run, videos: list[tuple[Video, int]], price: Price | None = None,
                ledger: dict | None = None) -> dict:
    counts = {s.value: 0 for s in Status}
    rows = []
    for v, micro in videos:
        counts[Status(v.status).value] += 1
        rows.append({
            "id": v.key, "status": Status(v.status).value, "uri": v.uri, "prompt": v.prompt, "seed": v.seed,
            "frames": v.frames, "fps": v.fps, "duration_s": v.duration_s, "width": v.width, "height": v.height,
            "steps": v.steps, "guidance": v.guidance, "bytes": v.bytes, "sha256": v.sha256,
            "attempts": v.attempts, "error": v.last_error,
            "render_s": v.render_s, "encode_s": v.encode_s, "upload_s": v.upload_s,
            "chunks": v.chunks, "seam_score": v.seam_score, "needs_review": v.needs_review,
            "cost_usd": micro / 1e6,
        })
    extra = summary(run, videos, price, ledger)
    return {
        "run_id": run.id, "name": run.name, "model": run.model, "output": run.output, "priority": run.priority,
        "source": run.source, "created_at": run.created_at.isoformat(), "counts": counts,
        "cost": extra.pop("cost"), **extra,
        "videos": rows,
    }


def print_report(console: Console, data: dict) -> None:
    console.print(f"run {data['run_id']} [bold]{data['name']}[/] ({data['model']}) -> {data['output']}",
                  highlight=False)
    table = Table("id", "status", "frames", "size", "chunks", "seams", "KiB", "sha256", "cost $", box=None,
                  pad_edge=False)
    for v in data["videos"]:
        kib = f"{v['bytes'] / 1024:.1f}" if v["bytes"] is not None else ""
        seams = "" if v["seam_score"] is None else f"{v['seam_score']:.2f}" + (" REVIEW" if v["needs_review"] else "")
        table.add_row(v["id"], v["status"], f"{v['frames']}@{v['fps']}", f"{v['width']}x{v['height']}",
                      str(v["chunks"]), seams, kib, (v["sha256"] or "")[:12], f"{v['cost_usd']:.6f}")
    console.print(table)
    for v in data["videos"]:
        if v["error"]:
            console.print(f"  {v['id']}: {v['error']}", markup=False, highlight=False)
    counts = ", ".join(f"{n} {k}" for k, n in data["counts"].items() if n)
    per = data["cost"]["per_successful_video_usd"]
    per_text = f"${per:.6f} per successful video" if per is not None else "no successful videos"
    idle = data["cost"]["idle_usd"]
    idle_text = f" + ${idle:.6f} idle worker time ({data['cost']['idle_s']:.1f} s, its share)" if idle else ""
    console.print(f"{counts}; total ${data['cost']['total_usd']:.6f}{idle_text}; {per_text}", highlight=False)
    if data["failures_by_reason"]:
        console.print("failures: " + ", ".join(f"{n} {reason}" for reason, n in data["failures_by_reason"].items()),
                      markup=False, highlight=False)
    t = data["throughput"]
    if t["videos_per_hour"]:
        console.print(f"throughput {t['videos_per_hour']:.1f} videos/hour, {t['video_seconds_per_hour']:.1f} "
                      f"video-seconds/hour over {t['span_s']:.1f} s; cost "
                      f"${data['cost']['per_video_second_usd']:.6f} per video-second", highlight=False)
    for name, key in (("queue wait", "queue_wait_s"), ("render latency", "render_latency_s")):
        q = data[key]
        if q:
            console.print(f"{name} s: P50 {q['p50']:.2f}, P95 {q['p95']:.2f}, P99 {q['p99']:.2f}", highlight=False)
    stages = data["stages_s"]
    if any(stages.values()):
        console.print("stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()), highlight=False)
    m = data["gross_margin"]
    if m:
        console.print(f"gross margin {m['gross_margin']:.1%} at ${m['price_per_video_second_usd']:g} per "
                      f"video-second ({m['source']})", highlight=False)
