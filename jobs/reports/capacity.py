"""`reelbatch capacity --run RUN --gpus N`: what N GPUs could render per day and month, at what cost and margin,
at three levels, from what a finished run measured.

- ceiling: every GPU busy all the time at the run's measured GPU seconds per successful video (its share of batch
  renders, plus encode and upload, as its cost record charges). A theoretical ceiling: no fleet runs at it.
- sustainable: the ceiling times the utilisation the run measured, capped at MAX_UTILISATION: past 70-80% queueing
  latency climbs steeply. Measured from the cost ledger where the run's workers had sessions (seconds charged over
  seconds up, model loading and waiting included: jobs.cost.ledger); otherwise busy GPU seconds over the active span
  times the GPUs that rendered it.
- budget: the sustainable level after the run's retry rate (retried renders over all renders, a long video's chunks
  each one render and none of them a retry: the first two levels already pay for retries in seconds, but they also
  take queue slots) and a headroom setting, for planning.

Cost per video at each level is the GPU-hour rate times the fleet's hours over the videos made; margin is against
the reference price per video-second times the run's mean video length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from jobs.cost.projection import UTILISATION
from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.summary import Price, summary

MAX_UTILISATION = UTILISATION  # the one figure, shared with when queued work is done (jobs.cost.projection)
DEFAULT_HEADROOM = 0.2
DAYS_PER_MONTH = 30


@dataclass(frozen=True)
class Level:
    name: str
    videos_per_hour: float
    videos_per_day: float
    videos_per_month: float
    cost_per_video_usd: float
    gross_margin: float


def plan(run: Run, videos: list[tuple[Video, int]], *, gpus: int, run_gpus: int, gpu_hour_usd: float,
         gpu_hour_source: str, price: Price, headroom: float = DEFAULT_HEADROOM,
         session_utilisation: float | None = None) -> dict:
    """`session_utilisation`: charged over up seconds of the sessions that served the run (jobs.cost.ledger), if any."""
    ok = [v for v, _ in videos if Status(v.status) is Status.SUCCEEDED]
    if not ok:
        raise ValueError(f"run {run.name} has no successful video to plan from")
    busy_s = sum((v.render_s or 0.0) + (v.encode_s or 0.0) + (v.upload_s or 0.0) for v in ok)
    per_video_s = busy_s / len(ok)
    span = summary(run, videos)["throughput"]["span_s"]
    if session_utilisation is not None:
        measured_utilisation, source = min(1.0, session_utilisation), "worker sessions: charged / up seconds"
    else:
        measured_utilisation = min(1.0, busy_s / (span * run_gpus)) if span else 1.0
        source = "busy seconds / (active span x run GPUs)"
    utilisation = min(measured_utilisation, MAX_UTILISATION)
    # Retries over claims, a claim being one chunk's render. A video's attempts are jobs.db.queries.report_attempts'
    # (one, plus each retry of any of its chunks), so its claims are its chunks plus its retries: a long video of
    # three chunks rendered once is three claims and no retry, and a run with no retries has a rate of 0.
    retries = [max(v.attempts, 1) - 1 for v, _ in videos if v.started_at is not None]
    claims = sum(retries) + sum(v.chunks or 1 for v, _ in videos if v.started_at is not None)
    retry_rate = sum(retries) / claims if claims else 0.0
    mean_length_s = sum(v.duration_s for v in ok) / len(ok)
    revenue_per_video = price.usd_per_video_s * mean_length_s

    def level(name: str, per_gpu_hour: float) -> Level:
        per_hour = per_gpu_hour * gpus
        cost = gpu_hour_usd * gpus / per_hour
        return Level(name, per_hour, per_hour * 24, per_hour * 24 * DAYS_PER_MONTH, cost,
                     (revenue_per_video - cost) / revenue_per_video)

    ceiling = 3600 / per_video_s
    levels = [level("ceiling", ceiling), level("sustainable", ceiling * utilisation),
              level("budget", ceiling * utilisation * (1 - retry_rate) * (1 - headroom))]
    return {
        "run": run.name, "gpus": gpus, "levels": [asdict(x) for x in levels],
        "assumptions": {
            "gpu_seconds_per_successful_video": per_video_s,
            "measured_utilisation": measured_utilisation, "utilisation_source": source, "run_gpus": run_gpus,
            "utilisation_used": utilisation, "utilisation_cap": MAX_UTILISATION,
            "retry_rate": retry_rate, "headroom": headroom,
            "gpu_hour_usd": gpu_hour_usd, "gpu_hour_source": gpu_hour_source,
            "price_per_video_second_usd": price.usd_per_video_s, "price_source": price.source,
            "mean_video_length_s": mean_length_s, "days_per_month": DAYS_PER_MONTH,
            "note": "the run's own mix of shapes and lengths; another mix needs another run (or reelbatch bench "
                    "ladder for one shape's steady state)",
        },
    }
