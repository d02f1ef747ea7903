"""Holding work: a claim (jobs.claims.claims) is a lease, renewed while the worker renders, fenced by a token.

The database is the source of truth. A claim sets each unit's lease (owner, expiry, a token that grows with every
claim). The worker renews the lease while it renders; every write it makes afterwards presents its token (`fenced`)
and changes nothing if the token is stale (its lease expired and the reaper handed the unit to someone else). The
reaper puts expired units back to pending, so a killed or frozen worker never holds work for longer than one lease.
Lease times come from the workers' clocks: keep them NTP-synchronised (leases are minutes, skew is milliseconds).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from sqlalchemy import select, tuple_, update
from sqlalchemy.orm import Session

from jobs.claims.claims import ClaimedUnit
from jobs.db.base import utcnow
from jobs.db.connect import reads
from jobs.db.queries import Factory
from jobs.db.rows import Run, Video, WorkUnit
from jobs.db.status import Status, move


def fenced(s: Session, unit: ClaimedUnit) -> tuple[WorkUnit, Video] | None:
    """The unit and video rows, locked, if this worker still holds the lease; else None (the write is refused)."""
    row = s.scalar(select(WorkUnit).where(WorkUnit.id == unit.unit_id).with_for_update())
    if row is None or row.lease_token != unit.token or row.status != Status.RUNNING:
        return None
    return row, s.get(Video, row.video_id, with_for_update=True)


def fenced_all(s: Session, units: list[ClaimedUnit]) -> dict[int, tuple[WorkUnit, Video]]:
    """`fenced` for several units in two statements, where it takes two each: by unit id, the unit and video rows of
    those whose lease this worker still holds, locked (the unit rows in id order, as a claim takes them, then their
    videos in id order). A batch's writes go through here: two statements per video were most of what recording a
    batch of small previews cost the database (docs/SCALE.md)."""
    rows = s.scalars(select(WorkUnit).where(WorkUnit.id.in_(sorted({unit.unit_id for unit in units})))
                     .order_by(WorkUnit.id).with_for_update())
    tokens = {unit.unit_id: unit.token for unit in units}
    held = {row.id: row for row in rows if row.lease_token == tokens[row.id] and row.status == Status.RUNNING}
    if not held:
        return {}
    videos = {video.id: video for video in s.scalars(
        select(Video).where(Video.id.in_(sorted({row.video_id for row in held.values()})))
        .order_by(Video.id).with_for_update())}
    return {unit_id: (row, videos[row.video_id]) for unit_id, row in held.items()}


def renew(factory: Factory, units: tuple[ClaimedUnit, ...], lease_s: float) -> set[int]:
    """Extend the leases this worker still holds; returns the ids of those units (a missing id was taken over).

    One statement for the batch, fenced as `fenced` is (the unit running under this worker's token): a renewal runs
    for every rendering worker every third of a lease, and a select, a lock and an update per unit made it most of
    the control plane's row locking (docs/SCALE.md)."""
    expires = utcnow() + timedelta(seconds=lease_s)
    with factory.begin() as s:
        return set(s.scalars(
            update(WorkUnit).where(tuple_(WorkUnit.id, WorkUnit.lease_token).in_([(u.unit_id, u.token) for u in units]),
                                   WorkUnit.status == Status.RUNNING)
            .values(lease_expires_at=expires).returning(WorkUnit.id)
            .execution_options(synchronize_session=False)))


def reap_expired(factory: Factory, *, max_attempts: int) -> Counter[str]:
    """Return units whose lease expired (a killed, frozen or partitioned worker) to pending; returns how many, by
    model (each needs a ticket on its model's queue).

    The claim that expired counted as an attempt: a unit that has used `max_attempts` is failed instead, so a video
    that kills its worker every time cannot loop forever.
    """
    requeued: Counter[str] = Counter()
    with factory.begin() as s:
        expired = list(s.scalars(select(WorkUnit).where(WorkUnit.status == Status.RUNNING,
                                                        WorkUnit.lease_expires_at < utcnow())
                                 .with_for_update(skip_locked=True)))
        for unit in expired:
            video = s.get(Video, unit.video_id)
            error = f"lease expired: worker {unit.lease_owner} stopped renewing it (attempt {unit.attempts})"
            if retry_or_fail(s, unit, video, error, max_attempts=max_attempts, not_before=None):
                requeued[unit.model] += 1
    return requeued


def retry_or_fail(s: Session, unit: WorkUnit, video: Video, error: str, *, max_attempts: int,
                  not_before: datetime | None, solo: bool = False) -> bool:
    """Back to pending (True), or failed after the last attempt, or cancelled if its run was cancelled."""
    unit.last_error = video.last_error = error[:4000]
    if s.get(Run, video.run_id).cancelled_at is not None:
        move(unit, video, Status.CANCELLED)
        return False
    if unit.attempts >= max_attempts:
        video.last_error = f"failed after {unit.attempts} attempts: {error}"[:4000]
        move(unit, video, Status.FAILED)
        return False
    move(unit, video, Status.PENDING)
    unit.not_before = not_before
    unit.solo = unit.solo or solo
    return True


def release(factory: Factory, unit: ClaimedUnit, *, solo: bool = False) -> bool:
    """Give a unit back without charging an attempt (shutdown, or its batch stopped for another's cancel; `solo`:
    its batch of several failed in a way that may be one video's, so it is claimed alone from now on).

    Units of a cancelled run become cancelled. False if the lease was already lost.
    """
    with factory.begin() as s:
        rows = fenced(s, unit)
        if rows is None:
            return False
        row, video = rows
        row.attempts -= 1
        video.attempts -= 1
        cancelled = s.get(Run, video.run_id).cancelled_at is not None
        move(row, video, Status.CANCELLED if cancelled else Status.PENDING)
        row.solo = row.solo or solo
        return True


def cancelled_runs(factory: Factory, run_ids: set[int]) -> set[int]:
    with reads(factory)() as s:  # every rendering batch asks every CANCEL_CHECK_S (jobs.render.keeper)
        return set(s.scalars(select(Run.id).where(Run.id.in_(run_ids), Run.cancelled_at.is_not(None))))
