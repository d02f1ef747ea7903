"""What a delivery says: a run's finish as one JSON object, made once when the notification is opened and sent
unchanged on every attempt (so every attempt carries the same signature input but for its timestamp)."""

from __future__ import annotations

import json
from datetime import datetime

from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.summary import summary

EVENT = "run.finished"


def body(delivery: str, run: Run, videos: list[tuple[Video, int]], result_uris: list[str], now: datetime) -> str:
    """The JSON text: the delivery id, the run, its counts by status, its cost and its result files."""
    counts = {status.value: 0 for status in Status}
    for video, _ in videos:
        counts[Status(video.status).value] += 1
    cost = summary(run, videos)["cost"]  # the videos' own charges; idle worker time is in `reelbatch report`
    results, errors = result_uris
    doc = {
        "event": EVENT,
        "delivery": delivery,
        "finished_at": now.isoformat(),
        "run": {"id": run.id, "name": run.name, "model": run.model, "round": run.round, "source": run.source,
                "output": run.output, "cancelled": run.cancelled_at is not None},
        "videos": len(videos),
        "counts": counts,
        "cost": {"total_usd": cost["total_usd"], "per_successful_video_usd": cost["per_successful_video_usd"]},
        "results": {"results_uri": results, "errors_uri": errors},
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
