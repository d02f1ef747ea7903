"""How many workers each model's queue wants now: the scaling signal `reelbatch scale`, the
reelbatch_desired_workers gauge and KEDA's query (jobs.db.scale_queries.desired_workers_sql) all give.

The rule, per model, stated once: desired = the most of
- busy: workers holding an unexpired lease on its work now (a scale-down below them would stop a batch);
- backlog: ceil(GPU seconds of its pending and claimed units / the drain horizon), a unit's seconds being the measured
  basis of `estimate` (jobs.cost.estimate: charged seconds per successful video of exactly its shape, over its
  newest RECENT) over its video's chunks; a shape with no measured video counts no seconds (its first videos
  measure it);
- deadlines: for each deadline D of its runs still ahead by more than a cold start, ceil(the GPU seconds of units due
  by D / (seconds to D minus the cold start)): a worker started now renders only after its cold start; a deadline
  closer than that is one no new worker can help, and is left out;
- one, while any of its work is pending or claimed (scaling from zero, KEDA's activation).
Each ceil forgives a millionth of a worker (jobs.db.scale_queries.SLACK). The deadline term asks that work finish by
its deadline, though a run's deadline only cancels work not started (jobs.db.limits.expire_due): it errs on more.
Workers serve models, not shape buckets (`reelbatch worker --models`), so the signal is per model.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from jobs.cost.estimate import BasisKind, Estimator, VideoShape
from jobs.db.base import utcnow
from jobs.db.scale_queries import SLACK, OpenUnits, measured_cold_start, open_units

# Defaults a deployment may override (`reelbatch scale --horizon-s/--cold-start-s`; the same figures written into
# KEDA's query). Ten minutes to drain a backlog; a cold start of two minutes, the middle of the 1-3 minutes of load
# and compile issue 43 reports on an H200 (a CPU's 15-25 s of compile per shape is well under it).
DRAIN_HORIZON_S = 600.0
COLD_START_S = 120.0


@dataclass(frozen=True)
class ModelSignal:
    model: str
    desired: int
    busy: int  # workers holding a live lease on its work
    backlog_s: float  # measured GPU seconds pending and claimed
    backlog_workers: int
    deadline_workers: int  # the most any deadline needs (0: none counts)
    deadline: str | None  # the deadline that needs them (ISO), if any
    units: int  # pending and claimed units
    unmeasured_units: int  # of those, units of shapes with no measured video (counted as no seconds)

    def to_dict(self) -> dict:
        return asdict(self)


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - SLACK))


def unit_seconds(est: Estimator, u: OpenUnits) -> float | None:
    """One unit's GPU seconds: its video's measured basis over its chunks; None when its shape has none."""
    shape = VideoShape(u.model, u.width, u.height, u.frames, u.steps, u.guidance, u.chunks, u.window)
    basis = est.seconds(shape)
    return basis.seconds / u.chunks if basis.kind is BasisKind.MEASURED else None


def signals(s: Session, now: datetime, horizon_s: float = DRAIN_HORIZON_S, cold_start_s: float = COLD_START_S,
            model: str | None = None) -> list[ModelSignal]:
    """Each model with work pending or claimed, by name."""
    est = Estimator(s, {})  # no bench profiles: the measured basis alone, as KEDA's query sees it
    by_model: dict[str, list[tuple[OpenUnits, float | None]]] = defaultdict(list)
    for u in open_units(s, model):
        by_model[u.model].append((u, unit_seconds(est, u)))
    return [_signal(m, rows, now, horizon_s, cold_start_s) for m, rows in sorted(by_model.items())]


def _signal(model: str, rows: list[tuple[OpenUnits, float | None]], now: datetime, horizon_s: float,
            cold_start_s: float) -> ModelSignal:
    busy = len({u.lease_owner for u, _ in rows
                if u.running and u.lease_owner and u.lease_expires_at is not None and u.lease_expires_at > now})
    backlog_s = sum((sec or 0.0) * u.units for u, sec in rows)
    backlog = _ceil(backlog_s / horizon_s)
    need, need_at = 0, None
    for due in sorted({u.deadline for u, _ in rows if u.deadline is not None}):
        left = (due - now).total_seconds() - cold_start_s
        if left <= 0:
            continue
        work = sum((sec or 0.0) * u.units for u, sec in rows if u.deadline is not None and u.deadline <= due)
        if (n := _ceil(work / left)) > need:
            need, need_at = n, due.isoformat()
    units = sum(u.units for u, _ in rows)
    return ModelSignal(model, max(busy, backlog, need, 1 if units else 0), busy, backlog_s, backlog, need, need_at,
                       units, sum(u.units for u, sec in rows if sec is None))


def signals_now(factory) -> list[ModelSignal]:
    """Each model's signal now at the default horizon and the measured cold start (the default without one): the
    workers' reelbatch_desired_workers."""
    with factory() as s:
        return signals(s, utcnow(), cold_start_s=cold_start(s)[0])


def cold_start(s: Session) -> tuple[float, str]:
    """(seconds, where they come from): the recent worker sessions' median cold start, else COLD_START_S."""
    measured = measured_cold_start(s)
    if measured is None:
        return COLD_START_S, "default (no worker session has measured one)"
    return measured[0], f"measured: the median of the last {measured[1]} worker sessions' first video stored"


def desired_total(found: list[ModelSignal]) -> int:
    return sum(m.desired for m in found)
