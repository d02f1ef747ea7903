"""Notifications in the database: opened once per run finish, claimed with a lease to be sent, every attempt
recorded, retried with backoff until accepted or 24 hours have passed.

Exactly one notification per finish: the unique (run, round) lets one caller insert it, however many processes see
the run finish at once. Exactly one sender at a time: a claim is a conditional update that takes a lease (owner,
expiry, a token that grows with every claim), as for work units, so two sweepers never POST the same notification
together. An accepted attempt makes it `delivered`, which is final: it is never claimed again. What cannot be made
exactly-once is the gap between a receiver accepting a POST and this table recording it (a sender killed there, or a
lease that expired mid-POST): the next claim sends it again, with the same body and delivery id, so receivers must
drop repeats by that id (docs/NOTIFICATIONS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import exists, or_, select
from sqlalchemy.exc import IntegrityError

from jobs.db.base import as_utc
from jobs.db.connect import reads
from jobs.db.queries import Factory, find_run
from jobs.db.rows import Run, Video
from jobs.db.service_rows import Notification, NotificationAttempt
from jobs.db.status import Status

# Longer than a POST may take (jobs.notify.send.TIMEOUT_S, 10 s) with room to record it.
LEASE_S = 60.0
# Retried for a day, as the issue asks (Stripe retries for three); each wait doubles up to an hour.
GIVE_UP_AFTER = timedelta(hours=24)
MAX_WAIT_S = 3600.0


@dataclass(frozen=True)
class Due:
    """A claimed notification: what to send, and the lease token that recording its outcome presents."""

    id: int
    key: str
    url: str
    body: str
    number: int  # this attempt's number, 1-based
    token: int


@dataclass(frozen=True)
class Attempt:
    number: int
    sender: str
    started_at: datetime
    duration_s: float
    status_code: int | None
    error: str | None
    accepted: bool


@dataclass(frozen=True)
class NotificationInfo:
    run: str
    round: int
    key: str
    url: str
    state: str
    next_attempt_at: datetime | None  # None once delivered or given up
    give_up_at: datetime
    delivered_at: datetime | None
    body: str
    attempts: list[Attempt]


def backoff_s(first_s: float, attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt: `first_s`, doubling per attempt, at most an hour."""
    return min(first_s * 2 ** max(attempts - 1, 0), MAX_WAIT_S)


def open_notification(factory: Factory, run: Run, key: str, body: str, now: datetime) -> int | None:
    """Insert the notification of `run`'s round, due now; its id, or None if someone else already has, or if the run
    was resumed since `run` was read (its videos wait again: that round's finish will be noticed in its turn)."""
    try:
        with factory.begin() as s:
            if s.scalar(select(Run.round).where(Run.id == run.id)) != run.round or s.scalar(
                    select(_busy(run.id))):
                return None
            row = Notification(run_id=run.id, round=run.round, key=key, url=run.notify_url, body=body,
                               state="pending", attempts=0, next_attempt_at=now, give_up_at=now + GIVE_UP_AFTER,
                               lease_token=0)
            s.add(row)
            s.flush()
            return row.id
    except IntegrityError:
        return None


def finished_unopened(factory: Factory) -> list[str]:
    """Runs with a webhook whose videos are all done and whose current round has no notification yet: finishes
    nobody noticed (a cancel, a reaped lease, a process that died between recording and opening)."""
    opened = exists().where(Notification.run_id == Run.id, Notification.round == Run.round)
    with factory() as s:
        return list(s.scalars(select(Run.name).where(Run.notify_url.is_not(None), ~_busy(Run.id), ~opened)
                              .order_by(Run.id)))


def _busy(run_id):
    """Has the run a video still waiting or rendering?"""
    return exists().where(Video.run_id == run_id, Video.status.in_([Status.PENDING, Status.RUNNING]))


def claim_due(factory: Factory, owner: str, now: datetime, *, only: int | None = None, limit: int = 5) -> list[Due]:
    """Take the lease of up to `limit` pending notifications that are due and not held by a live lease."""
    due = (Notification.state == "pending", Notification.next_attempt_at <= now,
           or_(Notification.lease_expires_at.is_(None), Notification.lease_expires_at < now))
    if only is not None:
        due = (*due, Notification.id == only)
    else:
        # Every worker's sweeper asks every tick and almost always nothing is due: a probe alone (jobs.db.connect.
        # reads) answers that in two round trips, where the locking transaction below takes four.
        with reads(factory)() as s:
            if s.scalar(select(Notification.id).where(*due).limit(1)) is None:
                return []
    query = (select(Notification).where(*due).order_by(Notification.next_attempt_at, Notification.id).limit(limit)
             .with_for_update(skip_locked=True))
    claimed = []
    with factory.begin() as s:
        for row in s.scalars(query):
            row.attempts += 1
            row.lease_owner, row.lease_token = owner, row.lease_token + 1
            row.lease_expires_at = now + timedelta(seconds=LEASE_S)
            claimed.append(Due(row.id, row.key, row.url, row.body, row.attempts, row.lease_token))
    return claimed


def record_attempt(factory: Factory, due: Due, attempt: Attempt, *, first_backoff_s: float, now: datetime) -> str:
    """Record one attempt (always: every attempt is kept) and move the notification on: `delivered` if accepted,
    else due again after the backoff, or `gave_up` if that would pass its 24 hours. A sender whose lease was taken
    over records its attempt but moves nothing, unless it was accepted. Returns the state after."""
    with factory.begin() as s:
        row = s.get(Notification, due.id, with_for_update=True)
        s.add(NotificationAttempt(notification_id=row.id, number=attempt.number, sender=attempt.sender,
                                  started_at=attempt.started_at, duration_s=attempt.duration_s,
                                  status_code=attempt.status_code, error=attempt.error, accepted=attempt.accepted))
        if row.state != "pending":
            return row.state
        if attempt.accepted:
            row.state, row.delivered_at = "delivered", now
        elif row.lease_token == due.token:
            after = now + timedelta(seconds=backoff_s(first_backoff_s, row.attempts))
            if after > as_utc(row.give_up_at):
                row.state = "gave_up"
            row.next_attempt_at = after
        else:
            return row.state
        row.lease_owner, row.lease_expires_at = None, None
        return row.state


def notifications(factory: Factory, run: str) -> list[NotificationInfo]:
    """A run's notifications (one per round that finished), each with every attempt, oldest first."""
    found = find_run(factory, run)
    run_id, name = found.id, found.name
    with factory() as s:
        rows = list(s.scalars(select(Notification).where(Notification.run_id == run_id).order_by(Notification.round)))
        attempts: dict[int, list[Attempt]] = {row.id: [] for row in rows}
        for a in s.scalars(select(NotificationAttempt).where(NotificationAttempt.notification_id.in_(attempts))
                           .order_by(NotificationAttempt.number)):
            attempts[a.notification_id].append(Attempt(a.number, a.sender, as_utc(a.started_at), a.duration_s,
                                                       a.status_code, a.error, a.accepted))
        return [NotificationInfo(name, r.round, r.key, r.url, r.state,
                                 as_utc(r.next_attempt_at) if r.state == "pending" else None, as_utc(r.give_up_at),
                                 r.delivered_at and as_utc(r.delivered_at), r.body, attempts[r.id]) for r in rows]
