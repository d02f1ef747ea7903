"""Prometheus metrics from each rendering process, served when `REELBATCH_METRICS_PORT` is set.

A prefork worker's children each serve on the port plus their pool index (child 1 on PORT+1, ...); a solo worker
serves on PORT. Scrape every port of every worker; sum across them in queries.

- reelbatch_videos_total{outcome}: videos succeeded, retried (an attempt failed and will run again) and failed;
- reelbatch_stage_seconds{stage}: per-video seconds of text, denoise, decode, encode and upload (histogram);
- reelbatch_batch_size: videos per claimed batch (histogram);
- reelbatch_gpu_seconds_total: seconds charged to videos (render share plus encode and upload; retries included);
- reelbatch_queue_depth: units claimable now, as this process's sweeper last saw (gauge);
- reelbatch_deadline_slack_seconds{run}: for each unfinished run with a deadline, its deadline minus its projected
  finish (jobs.cost.projection; negative: late), as this process's sweeper last saw (gauge; every worker reports
  the same figure: take the max or any, not the sum);
- reelbatch_team_running{team}, reelbatch_team_queued{team}: each team's videos running and pending, and
  reelbatch_team_month_usd{team}: its charges this calendar month (UTC), as the fleet's sweeper last saw (gauges;
  every worker that sweeps reports the same figure: take the max, not the sum);
- reelbatch_deadline_at_risk{run}: 1 when that run is projected to miss its deadline (or no worker is alive to
  render it), else 0 (gauge);
- reelbatch_desired_workers{model}: the workers that model's queue wants now (jobs.cost.scale, the figure
  `reelbatch scale` and KEDA's query give), as the fleet's sweeper last saw (gauge; take the max, not the sum);
- reelbatch_worker_busy: 1 while this process renders a batch, else 0, read when scraped (gauge): a scale-down
  stops a worker whose every process reads 0 (it still drains on SIGTERM);
- reelbatch_cold_start_seconds{stage}: seconds from this process's start to its first model loaded
  (`model_loaded`) and to its first video stored (`first_video`), set once (gauge);
- reelbatch_out_of_memory_total: batches that ran out of device memory and were split (each shrinks the device's
  memory envelope: jobs.render.envelopes).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

VIDEOS = Counter("reelbatch_videos", "Videos by outcome of an attempt", ["outcome"])
STAGE_SECONDS = Histogram("reelbatch_stage_seconds", "Per-video seconds by stage", ["stage"],
                          buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800))
BATCH_SIZE = Histogram("reelbatch_batch_size", "Videos per claimed batch", buckets=(1, 2, 4, 8, 16, 32, 64))
GPU_SECONDS = Counter("reelbatch_gpu_seconds", "Seconds charged to videos")
QUEUE_DEPTH = Gauge("reelbatch_queue_depth", "Claimable work units, as last seen by this process's sweeper")
DEADLINE_SLACK = Gauge("reelbatch_deadline_slack_seconds", "A run's deadline minus its projected finish", ["run"])
DEADLINE_AT_RISK = Gauge("reelbatch_deadline_at_risk", "1 if a run is projected to miss its deadline", ["run"])

TEAM_RUNNING = Gauge("reelbatch_team_running", "A team's videos running", ["team"])
TEAM_QUEUED = Gauge("reelbatch_team_queued", "A team's videos pending", ["team"])
TEAM_MONTH_USD = Gauge("reelbatch_team_month_usd", "A team's charges this calendar month (UTC)", ["team"])

DESIRED_WORKERS = Gauge("reelbatch_desired_workers", "Workers a model's queue wants now", ["model"])
WORKER_BUSY = Gauge("reelbatch_worker_busy", "1 while this process renders a batch")
COLD_START = Gauge("reelbatch_cold_start_seconds", "Seconds from process start to a stage, set once", ["stage"])
OUT_OF_MEMORY = Counter("reelbatch_out_of_memory", "Batches that ran out of device memory and were split")

_served: int | None = None
_desired_shown: set[str] = set()


_cold_seen: set[str] = set()


def cold_start(stage: str) -> float | None:
    """Set reelbatch_cold_start_seconds{stage} to this process's age, the first time `stage` is reached; returns
    that age then, else None."""
    if stage in _cold_seen:
        return None
    _cold_seen.add(stage)
    age = process_age_s()
    COLD_START.labels(stage).set(age)
    log.info("cold start: %s %.1f s after the process started", stage, age)
    return age


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start time in /proc/self/stat against /proc/uptime)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks since boot
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


def publish_scale(found) -> None:
    """Set reelbatch_desired_workers from jobs.cost.scale.signals' values; a model seen before that has no work left
    reads 0 (a scaler reading an absent series would not scale it down)."""
    for gone in _desired_shown - {m.model for m in found}:
        DESIRED_WORKERS.labels(gone).set(0)
    for m in found:
        DESIRED_WORKERS.labels(m.model).set(m.desired)
        _desired_shown.add(m.model)


def watch_busy(busy) -> None:
    """reelbatch_worker_busy reads `busy` (a threading.Event set while this process renders) at each scrape."""
    WORKER_BUSY.set_function(lambda: 1.0 if busy.is_set() else 0.0)


def publish_teams(usage) -> None:
    """Set the team gauges from jobs.db.teams.usage's rows."""
    for u in usage:
        TEAM_RUNNING.labels(u.team).set(u.running)
        TEAM_QUEUED.labels(u.team).set(u.queued)
        TEAM_MONTH_USD.labels(u.team).set(u.month_usd)


def serve(port: int) -> int:
    """Start the metrics endpoint once per process; returns the port it listens on."""
    global _served
    if _served is None:
        start_http_server(port, addr="0.0.0.0")
        _served = port
        log.info("metrics on :%d/metrics", port)
    return _served
