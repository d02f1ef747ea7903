"""The worker's housekeeping thread: reap expired leases, make sure waiting work has a ticket, and send due webhook
deliveries (jobs.notify).

Tickets can go missing by design (a retry waits out its backoff, a dead worker's unit is reaped long after its ticket
was used), so every worker process sweeps: it returns expired leases to pending (with a ticket each, on its model's
queue) and, when it is idle while work it serves is claimable, sends a ticket to that model's queue, which it
consumes. Extra tickets are harmless (an empty claim is a no-op); at most one per idle worker per interval is sent,
so the queue never floods. It is also the process's heartbeat for the cost ledger
(jobs.cost.ledger): it records the worker session's up time, and closes the sessions of workers whose heartbeats
stopped. Webhooks: it opens the notifications of finished runs nobody noticed, then retries the deliveries that are due;
any worker's sweeper may send any run's, one at a time (jobs.notify.outbox leases them).
And it keeps deadlines: a run whose deadline has come is expired (work not started is cancelled; its result files and
webhook follow once nothing of it runs), and each unfinished run's projected finish goes to the deadline gauges.

Every worker heartbeats, sends its idle ticket and delivers due webhooks on each sweep; the fleet's housekeeping
(closing lost sessions, reaping expired leases, deadlines, finished runs nobody noticed) is done by one sweeper, that
of the oldest session heard from within two intervals (jobs.cost.ledger.sweeping_session). Done by every worker, it
was a third of the statements a fleet sent per video (docs/SCALE.md), the same work N times over; if that worker
dies, the next oldest takes it over two intervals after its last heartbeat, well within a lease. A sweeper without a
session (no meter, or its session not yet open) does it all, as every sweeper once did.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

from jobs.claims import claims, leases
from jobs.cost import ledger, scale
from jobs.cost.meter import Meter
from jobs.db import limits, teams
from jobs.db.base import utcnow
from jobs.notify import finished, send
from jobs.observe import prometheus
from jobs.settings import Settings
from jobs.work import deadlines

log = logging.getLogger(__name__)


class Sweeper(threading.Thread):
    """`send_tickets(n, model)` sends n tickets to a model's queue; `models` are those this worker serves."""

    def __init__(self, settings: Settings, factory, busy: threading.Event, send_tickets: Callable[[int, str], None],
                 meter: Meter | None, models: tuple[str, ...]):
        super().__init__(name="reelbatch-sweeper", daemon=True)
        self.settings, self.factory, self.busy, self.send_tickets = settings, factory, busy, send_tickets
        # A callable: asked at each sweep (the models whose gates pass now: a gate recorded while the worker runs
        # brings its model's work tickets, no restart).
        self.meter, self._models = meter, models
        # Often enough that reaped work restarts within a fraction of a lease; rarely enough to cost nothing.
        self.interval = max(1.0, min(15.0, settings.limits.lease_s / 4))
        self.stopped = threading.Event()
        self.gauges = deadlines.Gauges(settings)

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - database or broker briefly away: sweep again next interval
                log.warning("sweep failed; trying again in %.0f s", self.interval, exc_info=True)

    @property
    def models(self) -> tuple[str, ...]:
        return self._models() if callable(self._models) else self._models

    def sweep(self) -> None:
        models = self.models
        if self.meter is not None:
            self.meter.heartbeat()
        fleet = self.fleet_turn()
        requeued: Counter[str] = Counter()
        if fleet:
            # A session silent for three leases belongs to a dead worker: its leases have expired, its batch is lost.
            if lost := ledger.close_lost_sessions(self.factory, 3 * self.settings.limits.lease_s):
                log.warning("closed %d worker sessions whose heartbeats stopped", lost)
            requeued = leases.reap_expired(self.factory, max_attempts=self.settings.limits.max_attempts)
        if self.settings.worker.metrics_port:  # a count of every claimable unit: only where someone reads it
            prometheus.QUEUE_DEPTH.set(claims.claimable_count(self.factory, models))
        if requeued:
            log.warning("returned %d units with expired leases to the queue", requeued.total())
            for model, n in requeued.items():
                self.send_tickets(n, model)
        elif not self.busy.is_set() and (model := claims.next_model(self.factory, models)) is not None:
            self.send_tickets(1, model)
        if fleet:
            self.keep_deadlines()  # whatever it meets, leases were reaped and tickets sent
            finished.catch_up(self.settings, self.factory)
            if self.settings.worker.metrics_port:  # each team's figures, from the sweeping worker only
                prometheus.publish_teams(teams.usage(self.factory))
                prometheus.publish_scale(scale.signals_now(self.factory))
        elif self.settings.worker.metrics_port:  # this process's own deadline gauges
            self.gauges.publish(self.factory)
        send.deliver_due(self.settings, self.factory)

    def fleet_turn(self) -> bool:
        """Whether this sweep does the fleet's housekeeping: this worker's session is the oldest one heard from
        within two intervals, or it has none."""
        mine = None if self.meter is None else self.meter.session_id
        if mine is None:
            return True
        oldest = ledger.sweeping_session(self.factory, 2 * self.interval)
        return oldest is None or oldest == mine

    def keep_deadlines(self) -> None:
        expired = limits.expire_due(self.factory, utcnow())
        for run in expired:
            log.warning("run %s reached its deadline: its videos not started are cancelled", run)
        # Result files and webhook now if nothing of the run still runs; else the batch still running notices it.
        finished.run_finished(self.settings, self.factory, expired)
        self.gauges.publish(self.factory)
