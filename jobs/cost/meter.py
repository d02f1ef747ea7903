"""A worker process's clock of paid time (jobs.cost.ledger says how its seconds are split and charged).

`Meter.busy()` marks the main thread rendering; `Meter.uncovered()` measures background work (storing) net of the
renders it overlapped, so a second is never charged twice; the heartbeat writes the session's up time, and its up time
when its last work ended (idle time after that is no run's). The clock is
injectable, so a test can drive it (tests/jobs/test_ledger.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy import case, update
from sqlalchemy.exc import SQLAlchemyError

from jobs.cost.prices import Rate
from jobs.db.base import utcnow
from jobs.db.queries import Factory
from jobs.db.rows import WorkerSession

log = logging.getLogger(__name__)


def _at_least(column, value: float):
    """`column` raised to `value`, never lowered: a heartbeat read before a block ended but written after it
    cannot take back the later figure (the sweeper's thread and the worker's write the same row)."""
    return case((column > value, column), else_=value)


class Span:
    """The seconds of one `Meter.busy` or `Meter.uncovered` block, readable once the block has ended."""

    seconds: float = 0.0


class Meter:
    """One process's clock of paid time, and its session row (none without a `factory`: benches, tests).

    `busy()` marks the main thread rendering; `uncovered()` measures background work (storing) net of the renders it
    overlapped. The clock is injectable so a test can drive it.
    """

    def __init__(self, rate: Rate, factory: Factory | None = None, owner: str = "",
                 clock: Callable[[], float] = time.monotonic, models: tuple[str, ...] | None = None):
        self.rate, self.factory, self.owner, self.clock = rate, factory, owner, clock
        self.models = models  # what the worker serves, recorded on its session (None: not recorded)
        self.session_id: int | None = None
        self._lock = threading.Lock()
        self._busy_total = 0.0
        # The render in progress: its videos and its start on the clock (None while the main thread is not busy).
        self._in_flight: tuple[tuple[int, ...], float] | None = None
        self._started = clock()
        self._worked = self._started  # the clock when the last busy or uncovered block ended
        self._closed = False

    # ---- the session row -------------------------------------------------------------------------------------------

    def open(self) -> int | None:
        """Start this process's session (its up time counts from here). Returns its id."""
        if self.factory is None:
            return None
        self._started = self._worked = self.clock()
        with self.factory.begin() as s:
            row = WorkerSession(owner=self.owner, up_s=0.0, worked_s=0.0, rate_usd_per_hour=self.rate.usd_per_hour,
                                rate_source=self.rate.source,
                                models=None if self.models is None else ",".join(self.models))
            s.add(row)
            s.flush()
            self.session_id = row.id
        return self.session_id

    def up_s(self) -> float:
        return self.clock() - self._started

    def worked_s(self) -> float:
        """Seconds up when the last render or storing ended (the batch in flight, if any, counts to now): the idle
        time after it belongs to no run (jobs.cost.ledger)."""
        with self._lock:
            end = self.clock() if self._in_flight is not None else self._worked
        return max(0.0, end - self._started)

    def heartbeat(self) -> None:
        """Record the up time and the batch in flight. A session closed by a sweeper (this process was taken for
        dead) is not written again: a new one starts, so no second is counted twice. Opens the session if opening
        it failed before (the database was away)."""
        if self.factory is None or self._closed:
            return
        if self.session_id is None:
            self.open()
            return
        with self._lock:
            in_flight = self._in_flight
        # One statement: the row is written only while it is open (a sweeper's close sets ended_at under the same
        # row lock), and no row written means the session was closed (or is gone).
        with self.factory.begin() as s:
            beat = s.execute(update(WorkerSession)
                             .where(WorkerSession.id == self.session_id, WorkerSession.ended_at.is_(None))
                             .values(up_s=_at_least(WorkerSession.up_s, self.up_s()),
                                     worked_s=_at_least(WorkerSession.worked_s, self.worked_s()),
                                     last_seen_at=utcnow(),
                                     models=None if self.models is None else ",".join(self.models),
                                     in_flight_videos=",".join(map(str, in_flight[0])) if in_flight else None,
                                     in_flight_since_s=max(0.0, in_flight[1] - self._started) if in_flight else None)
                             .execution_options(synchronize_session=False))
        if beat.rowcount == 0:
            self.open()

    def _worked_now(self) -> None:
        """Write the up time and `worked_s` as a render or a batch's storing ends, before any record of that work is:
        so a report read once a run's last video is recorded already sees when its workers' last work ended, and
        reads the same at every later heartbeat (its cost is fixed when its last video ends). A database briefly
        away is left to the next heartbeat."""
        if self.factory is None or self._closed or self.session_id is None:
            return
        try:
            with self.factory.begin() as s:
                s.execute(update(WorkerSession)
                          .where(WorkerSession.id == self.session_id, WorkerSession.ended_at.is_(None))
                          .values(up_s=_at_least(WorkerSession.up_s, self.up_s()),
                                  worked_s=_at_least(WorkerSession.worked_s, self.worked_s()))
                          .execution_options(synchronize_session=False))
        except SQLAlchemyError as exc:
            log.warning("recording session %s's last work failed (the next heartbeat will): %s", self.session_id, exc)

    def record_cold_start(self, seconds: float) -> None:
        """Keep this process's cold start (its start to its first video stored) on its session, once."""
        if self.factory is None or self.session_id is None:
            return
        try:
            with self.factory.begin() as s:
                s.execute(update(WorkerSession)
                          .where(WorkerSession.id == self.session_id, WorkerSession.cold_start_s.is_(None))
                          .values(cold_start_s=seconds).execution_options(synchronize_session=False))
        except SQLAlchemyError as exc:
            log.warning("recording session %s's cold start failed: %s", self.session_id, exc)

    def close(self) -> None:
        self._closed = True
        if self.session_id is None:
            return
        with self.factory.begin() as s:
            row = s.get(WorkerSession, self.session_id, with_for_update=True)
            if row is not None and row.ended_at is None:
                row.up_s, row.last_seen_at, row.ended_at, row.end_reason = self.up_s(), utcnow(), utcnow(), "stopped"
                row.worked_s = self.worked_s()
                row.in_flight_videos = row.in_flight_since_s = None
        self.session_id = None

    # ---- measuring ---------------------------------------------------------------------------------------------------

    def _busy_now(self, now: float) -> float:
        return self._busy_total + (now - self._in_flight[1] if self._in_flight is not None else 0.0)

    @contextmanager
    def busy(self, video_ids: Iterable[int] = ()) -> Iterator[Span]:
        """The main thread renders these videos: its seconds are theirs. Not reentrant (one render at a time)."""
        span = Span()
        with self._lock:
            start = self.clock()
            self._in_flight = (tuple(video_ids), start)
        try:
            yield span
        finally:
            with self._lock:
                end = self.clock()
                self._busy_total += end - start
                self._in_flight = None
                self._worked = max(self._worked, end)
            span.seconds = end - start
            self._worked_now()

    @contextmanager
    def uncovered(self) -> Iterator[Span]:
        """Background work (storing a batch): its seconds minus those a render (`busy`) covered meanwhile."""
        span = Span()
        with self._lock:
            start = self.clock()
            busy_start = self._busy_now(start)
        try:
            yield span
        finally:
            with self._lock:
                end = self.clock()
                covered = self._busy_now(end) - busy_start
                self._worked = max(self._worked, end)
            span.seconds = max(0.0, (end - start) - covered)
            self._worked_now()
