"""Whether a claimed batch may start: its runs' deadlines and cost caps, checked in the claim's own transaction
(jobs.claims.claims.claim_batch), so no batch starts that the check did not see.

- deadline: a run whose deadline has come starts nothing more: it is held, and the next sweep expires it
  (jobs.db.limits.expire_due: its waiting videos end cancelled, reason deadline, and its result files are written).
- budget: a run with `max_cost_usd` starts a unit only while what it has been charged (every cost record of its
  videos), plus the estimate of its units in flight, plus the estimate of the units starting now stays within its
  cap. Estimates are jobs.cost.estimate's GPU seconds per video (a unit is its share: one chunk of a long video) at
  the claiming worker's rate, plus the storage and egress of its bytes. A batch is trimmed to the units that fit.
  When none fits: if some of the run is in flight, the run is held (skipped by this claim; what its batches in flight
  are charged decides), else its budget is reached: its waiting videos end cancelled, reason budget. A unit of a
  shape with no basis is started alone, and only when nothing of its run is in flight: its charge is the basis for
  the next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.cost import profiles
from jobs.cost.estimate import Estimator, VideoShape
from jobs.cost.prices import Rate, StoragePrice
from jobs.db import limits
from jobs.db.base import as_utc
from jobs.db.rows import Run, Video, WorkUnit
from jobs.db.status import Status
from jobs.errors import UsageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    keep: list[WorkUnit]
    # Runs this claim passes over: past their deadline, or nothing fits until their batches in flight end.
    held: set[int] = field(default_factory=set)


@dataclass
class Gate:
    """What a worker prices units with: its rate, the storage prices it charges, and the bench profiles."""

    rate: Rate
    storage: StoragePrice | None
    cache_dir: Path | None = None
    _profiles: dict | None = None
    # The names of the runs whose budget this gate found reached (their result files may be due).
    stopped: list[str] = field(default_factory=list)

    def profiles(self) -> dict:
        if self._profiles is None:
            try:
                self._profiles = profiles.load(self.cache_dir, shipped=False) if self.cache_dir else {}
            except UsageError as exc:  # a worker keeps working: the estimate goes without profiles
                log.warning("%s", exc)
                self._profiles = {}
        return self._profiles

    def admit(self, s: Session, units: list[WorkUnit], videos: dict[int, Video], runs: dict[int, Run],
              now: datetime) -> Verdict:
        """The units of `units` that may start now (in order); holds and stops runs as the module says."""
        by_run: dict[int, list[WorkUnit]] = {}
        for unit in units:
            by_run.setdefault(videos[unit.video_id].run_id, []).append(unit)
        keep, held = [], set()
        est = None
        for run_id, mine in by_run.items():
            run = runs[run_id]
            if run.deadline is not None and as_utc(run.deadline) <= now:
                held.add(run_id)
                continue
            if run.max_cost_micro_usd is None:
                keep += mine
                continue
            est = est or Estimator(s, self.profiles())
            fits, hold = self._within_budget(s, est, run, mine, videos, now)
            keep += fits
            if hold:
                held.add(run_id)
        return Verdict([u for u in units if u in keep], held)

    def _within_budget(self, s: Session, est: Estimator, run: Run, mine: list[WorkUnit], videos: dict[int, Video],
                       now: datetime) -> tuple[list[WorkUnit], bool]:
        running = list(s.execute(select(WorkUnit, Video).join(Video, Video.id == WorkUnit.video_id).where(
            Video.run_id == run.id, WorkUnit.status == Status.RUNNING, WorkUnit.id.not_in([u.id for u in mine]))))
        in_flight = sum(self._unit_micro(est, run, u, v) or 0 for u, v in running)
        charged = limits.charged_micro_usd(s, run.id)
        room = run.max_cost_micro_usd - charged - in_flight
        fits = []
        for unit in mine:
            cost = self._unit_micro(est, run, unit, videos[unit.video_id])
            if cost is None:  # no basis: one unit alone, with nothing of the run in flight, as long as room is left
                if running or fits or room <= 0:
                    break
                fits.append(unit)
                break
            if cost > room:
                break
            fits.append(unit)
            room -= cost
        if fits:
            return fits, False
        if running:
            return [], True
        first = mine[0]
        cost = self._unit_micro(est, run, first, videos[first.video_id])
        estimate = "no estimate" if cost is None else f"its next video was estimated at ${cost / 1e6:.6f}"
        self.stopped.append(run.name)
        limits.stop_for_budget(s, run, now, (
            f"budget: not started: run {run.name} has been charged ${charged / 1e6:.6f} of its max_cost_usd "
            f"${run.max_cost_micro_usd / 1e6:.6f}, and {estimate}"))
        return [], False

    def _unit_micro(self, est: Estimator, run: Run, unit: WorkUnit, video: Video) -> int | None:
        """One unit's estimate in micro-dollars (its share of its video's); None when its shape has no basis."""
        shape = VideoShape(run.model, video.width, video.height, video.frames, video.steps, video.guidance,
                           video.chunks, unit.frames)
        seconds = est.seconds(shape).seconds
        if seconds is None:
            return None
        micro = self.rate.micro_usd(seconds / shape.chunks)
        per_s, _ = est.bytes_per_video_s(shape, video.fps)
        if per_s is not None and self.storage is not None:
            micro += sum(self.storage.micro_usd(per_s * video.duration_s / shape.chunks))
        return micro
