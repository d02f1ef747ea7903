"""A run's limits in the database: its cost cap changed (`reelbatch budget`), its waiting work cancelled for a reason
(its budget reached, its deadline come), and runs whose deadline has come expired, each exactly once.

Cancelling for a reason is the same move as `reelbatch cancel` (waiting units and their videos to cancelled; running
batches are left to finish), with the reason in `videos.cancel_reason` and a sentence in `last_error`. Nothing
already stored is touched. Which batch may start is decided in jobs.claims.gate, in the claim's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.db.base import as_utc, utcnow
from jobs.db.queries import Factory, _move_units, _move_videos, _run_id, requeue, waiting_units
from jobs.db.rows import CostRecord, Run, Video, WorkUnit
from jobs.db.status import CancelReason, Status


def utc_text(moment: datetime) -> str:
    return f"{as_utc(moment):%Y-%m-%dT%H:%M:%SZ}"


def cancel_waiting(s: Session, run: Run, reason: CancelReason, message: str) -> int:
    """Cancel the run's waiting units (a long video's ready chunk speaks for it), giving `reason`; returns how many.

    Set-based, as queries.cancel_run (one row at a time, a 100,000-video run's budget stop held a worker's claim
    transaction for over a minute). A unit another transaction is claiming is no longer waiting once that commits
    (PostgreSQL rechecks the condition on the row it waited for), and is left to it. The session's own changes are
    flushed first, and the units and videos it holds are expired after, so that none of them is read stale."""
    s.flush()
    message = message[:4000]
    ids = _move_units(s, run.id, waiting_units(), Status.CANCELLED, lease_owner=None, lease_expires_at=None,
                      last_error=message)
    _move_videos(s, ids, Status.CANCELLED, finished_at=utcnow(), cancel_reason=reason.value, last_error=message)
    for held in list(s.identity_map.values()):
        if isinstance(held, (WorkUnit, Video)):
            s.expire(held)
    return len(ids)


def stop_for_budget(s: Session, run: Run, now: datetime, message: str) -> int:
    """The run's budget is reached: its waiting videos end cancelled (reason budget)."""
    if run.budget_reached_at is None:
        run.budget_reached_at = now
    return cancel_waiting(s, run, CancelReason.BUDGET, message)


def expire(s: Session, run: Run, now: datetime) -> int:
    """The run's deadline has come: work not yet started is cancelled (reason deadline) and the run is expired.
    Returns how many units were cancelled."""
    if run.expired_at is None:
        run.expired_at = now
    return cancel_waiting(s, run, CancelReason.DEADLINE,
                          f"deadline: not started before run {run.name}'s deadline {utc_text(run.deadline)}")


def expire_due(factory: Factory, now: datetime) -> list[str]:
    """Expire every run whose deadline is at or before `now`: those not expired yet, and those expired with work
    waiting again (a batch running at the deadline that failed and was put back). Returns their names.

    Exactly once: `expired_at` is set the first time, in the same transaction as the cancellations, and the run
    rows are locked (SKIP LOCKED: two sweepers take different runs).
    """
    waiting = select(WorkUnit.id).join(Video).where(Video.run_id == Run.id, *waiting_units()).exists()
    with factory.begin() as s:
        runs = list(s.scalars(select(Run).where(Run.deadline <= now, Run.expired_at.is_(None) | waiting)
                              .with_for_update(skip_locked=True)))
        for run in runs:
            expire(s, run, now)
        return [run.name for run in runs]


def charged_micro_usd(s: Session, run_id: int) -> int:
    """Everything charged to the run's videos so far (every kind of cost record), in micro-dollars."""
    # int(): PostgreSQL sums a BIGINT column as NUMERIC (a Decimal).
    return int(s.scalar(select(func.coalesce(func.sum(CostRecord.amount_micro_usd), 0))
                        .join(Video, Video.id == CostRecord.video_id).where(Video.run_id == run_id)))


@dataclass(frozen=True)
class BudgetChange:
    name: str
    max_cost_usd: float | None
    charged_usd: float
    requeued: int  # videos cancelled for the budget, back in the queue


def set_budget(factory: Factory, run: str, max_cost_usd: float | None) -> BudgetChange:
    """Set (or, with None, remove) a run's cost cap. The videos its budget cancelled go back to pending, so raising it
    continues the run; the claim path cancels them again if the new cap is still too small. Nothing stored changes.
    A run cancelled by `reelbatch cancel` keeps its videos cancelled: `resume` is what restarts it."""
    with factory.begin() as s:
        row = s.get(Run, _run_id(s, run), with_for_update=True)
        row.max_cost_micro_usd = None if max_cost_usd is None else round(max_cost_usd * 1e6)
        row.budget_reached_at = None
        requeued = 0 if row.cancelled_at is not None else requeue(s, row.id, (
            WorkUnit.status == Status.CANCELLED, WorkUnit.video_id.in_(
                select(Video.id).where(Video.run_id == row.id, Video.cancel_reason == CancelReason.BUDGET.value))))
        return BudgetChange(row.name, max_cost_usd, charged_micro_usd(s, row.id) / 1e6, requeued)
