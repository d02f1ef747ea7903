"""One status enum for the life of a video and of its work units, and the one place that changes it."""

from __future__ import annotations

import enum
from datetime import datetime, timezone


class Status(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class CancelReason(str, enum.Enum):
    """Why reelbatch itself cancelled a video (stored in `videos.cancel_reason`; a user's `cancel` leaves it empty).
    It is the video's error code in errors.jsonl."""

    BUDGET = "budget"  # starting it would have taken its run past `max_cost_usd`
    DEADLINE = "deadline"  # not started before its run's deadline


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})

# Legal moves. A succeeded video never changes again; failed and cancelled ones may be resumed (back to pending).
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.RUNNING, Status.CANCELLED}),
    Status.RUNNING: frozenset({Status.SUCCEEDED, Status.FAILED, Status.PENDING, Status.CANCELLED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset({Status.PENDING}),
    Status.CANCELLED: frozenset({Status.PENDING}),
}


class IllegalTransition(Exception):
    pass


def check_move(row, new: Status) -> None:
    """Refuse a move of a row (anything with a `status`) that the table above does not allow."""
    old = Status(row.status)
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{type(row).__name__} {getattr(row, 'id', '?')}: {old.value} -> {new.value}")


def transition(row, new: Status) -> None:
    """Move a row (anything with a `status`) to `new`, refusing moves the table above does not allow."""
    check_move(row, new)
    row.status = new


def move(unit, video, new: Status) -> None:
    """A work unit and its video change status together (a long video's chunks move it one at a time; between
    chunks, jobs.claims.leases.record_chunk moves them apart).

    Leaving `running` drops the lease; reaching a terminal status stamps the video's finish time.
    """
    transition(unit, new)
    transition(video, new)
    if new is not Status.RUNNING:
        unit.lease_owner, unit.lease_expires_at = None, None
    if new.terminal:
        video.finished_at = datetime.now(timezone.utc)
