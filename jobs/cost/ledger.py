"""The cost ledger: every second a worker process is up, charged to a video or counted idle.

A worker process opens a session (a `worker_sessions` row) when it starts and closes it when it stops; its heartbeat
(the sweeper's interval) records how long it has been up on its own monotonic clock. Its seconds split three ways:

- rendering: the main thread's batch renders, split across the batch's videos by their share of the work;
- storing: encode and upload seconds that no render covered. With the finisher, batch k is stored while batch k+1
  renders; the seconds that overlap a render are already paid for by that render, so charging them again would make
  the worker's hour longer than an hour. What no render covered (the last batch, a wait for a slow store) is
  charged to the stored videos. This is `Meter.uncovered`;
- idle: the rest (loading the model, waiting for work), kept on the session. What came before the session's last
  work (its `worked_s`: up seconds when its last render or storing ended) is spread by reports over the successful
  videos of the runs the session served; what came after is the ledger's alone. So a worker that stays up after a
  run's last video, waiting, does not change that run's cost: a run's report is the same at any time after it ends
  while its workers serve nothing else. Known limit: a worker that later serves another run spreads the idle time
  before that work over both runs' videos (the session keeps one figure, not a timeline).

Charges are cost records in micro-dollars at the session's rate, so for every closed session the charged amounts
plus its idle amount equal its up time x its rate, to rounding (half a micro-dollar per record). A session whose
heartbeats stop (a killed or frozen worker) is closed by another worker's sweeper: the batch it had in flight is
charged to those videos (kind "lost", like a retry), and its up time ends at its last heartbeat.

A worker whose lease was lost writes nothing, cost records included (another worker holds the video now): the seconds
of that attempt stay on its session as idle, or, if its session was closed as lost, were charged as above. Known
limit: a worker presumed lost (no heartbeat for three leases, e.g. a database outage that long) that comes back and
still holds its leases has that batch charged twice, once as "lost" and once by its own record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.cost.prices import Rate, charge
from jobs.db.base import utcnow
from jobs.db.connect import reads
from jobs.db.queries import Factory
from jobs.db.rows import CostRecord, PrunedCharge, Video, WorkerSession
from jobs.db.status import Status


def close_lost_sessions(factory: Factory, stale_after_s: float, now: datetime | None = None) -> int:
    """Close sessions whose heartbeats stopped `stale_after_s` ago: the batch each had in flight is charged to its
    videos (kind "lost"), and its up time ends at its last heartbeat. Returns how many were closed."""
    now = now or utcnow()
    closed = 0
    with factory.begin() as s:
        stale = s.scalars(select(WorkerSession).where(
            WorkerSession.ended_at.is_(None),
            WorkerSession.last_seen_at < now - timedelta(seconds=stale_after_s)).with_for_update(skip_locked=True))
        for row in stale:
            rate = Rate(row.rate_usd_per_hour, row.rate_source)
            ids = [int(x) for x in (row.in_flight_videos or "").split(",") if x]
            if ids and row.in_flight_since_s is not None and row.up_s > row.in_flight_since_s:
                share = (row.up_s - row.in_flight_since_s) / len(ids)
                existing = set(s.scalars(select(Video.id).where(Video.id.in_(ids))))
                s.add_all(charge(i, "lost", share, rate, row.id) for i in ids if i in existing)
                row.worked_s = row.up_s  # that batch was its last work
            row.ended_at, row.end_reason = now, "lost"
            closed += 1
    return closed


def sweeping_session(factory: Factory, fresh_s: float, now: datetime | None = None) -> int | None:
    """The session whose sweeper does the fleet's housekeeping (jobs.work.sweeper): the oldest open one heard from
    within `fresh_s`; None if there is none."""
    now = now or utcnow()
    with reads(factory)() as s:  # every worker's sweeper asks every tick
        return s.scalar(select(func.min(WorkerSession.id)).where(
            WorkerSession.ended_at.is_(None), WorkerSession.last_seen_at >= now - timedelta(seconds=fresh_s)))


@dataclass(frozen=True)
class SessionLedger:
    id: int
    owner: str
    state: str  # "open", "stopped" or "lost"
    up_s: float
    charged_s: float
    idle_s: float
    spread_s: float  # the idle seconds before its last work: its runs' (idle_s - spread_s is the ledger's alone)
    rate_usd_per_hour: float
    rate_source: str
    total_micro_usd: int  # up_s at the rate
    charged_micro_usd: int  # the cost records behind it
    idle_micro_usd: int
    spread_micro_usd: int
    runs: dict[int, int]  # run id -> successful videos of it this session worked on
    pruned_videos: int = 0  # successful videos of pruned runs it worked on (jobs.db.prune), counted as served


def sessions(factory: Factory, session_ids: Iterable[int] | None = None) -> list[SessionLedger]:
    """Each session's up time split into charged and idle seconds and money, and the runs it served."""
    with factory() as s:
        query = select(WorkerSession).order_by(WorkerSession.id)
        if session_ids is not None:
            query = query.where(WorkerSession.id.in_(list(session_ids)))
        rows = list(s.scalars(query))
        ids = [r.id for r in rows]
        # float/int: PostgreSQL sums a BIGINT column as NUMERIC (a Decimal).
        charged = {sid: (float(secs or 0.0), int(micro or 0)) for sid, secs, micro in s.execute(
            select(CostRecord.session_id, func.sum(CostRecord.seconds), func.sum(CostRecord.amount_micro_usd))
            .where(CostRecord.session_id.in_(ids)).group_by(CostRecord.session_id))}
        served: dict[int, dict[int, int]] = {}
        for sid, run_id, n in s.execute(
                select(CostRecord.session_id, Video.run_id, func.count(func.distinct(Video.id)))
                .join(Video, Video.id == CostRecord.video_id)
                .where(CostRecord.session_id.in_(ids), Video.status == Status.SUCCEEDED)
                .group_by(CostRecord.session_id, Video.run_id)):
            served.setdefault(sid, {})[run_id] = n
        # The runs pruned since (jobs.db.prune): their records summed, their charges and served videos still here.
        pruned = {sid: (float(secs or 0.0), int(micro or 0), int(n or 0)) for sid, secs, micro, n in s.execute(
            select(PrunedCharge.session_id, func.sum(PrunedCharge.seconds), func.sum(PrunedCharge.amount_micro_usd),
                   func.sum(PrunedCharge.succeeded_videos))
            .where(PrunedCharge.session_id.in_(ids)).group_by(PrunedCharge.session_id))}
    out = []
    for r in rows:
        rate = Rate(r.rate_usd_per_hour, r.rate_source)
        secs, micro = charged.get(r.id, (0.0, 0))
        gone_s, gone_micro, gone_videos = pruned.get(r.id, (0.0, 0, 0))
        secs, micro = secs + gone_s, micro + gone_micro
        idle = max(0.0, r.up_s - secs)
        # A session recorded before `worked_s` existed spreads all its idle time, as reports did then.
        spread = min(idle, max(0.0, (r.up_s if r.worked_s is None else r.worked_s) - secs))
        state = "open" if r.ended_at is None else (r.end_reason or "stopped")
        out.append(SessionLedger(r.id, r.owner, state, r.up_s, secs, idle, spread, r.rate_usd_per_hour,
                                 r.rate_source, rate.micro_usd(r.up_s), micro, rate.micro_usd(idle),
                                 rate.micro_usd(spread), served.get(r.id, {}), gone_videos))
    return out


@dataclass(frozen=True)
class Charges:
    """A run's cost records summed by kind, and the worker sessions behind them."""
    by_kind: list[tuple[str, int, float]]  # kind, micro-dollars, worker seconds
    sessions: list[int]


def run_charges(s: Session, run_id: int) -> Charges:
    kinds = s.execute(select(CostRecord.kind, func.sum(CostRecord.amount_micro_usd), func.sum(CostRecord.seconds))
                      .join(Video, Video.id == CostRecord.video_id).where(Video.run_id == run_id)
                      .group_by(CostRecord.kind)).all()
    ids = list(s.scalars(select(func.distinct(CostRecord.session_id)).join(Video, Video.id == CostRecord.video_id)
                         .where(Video.run_id == run_id, CostRecord.session_id.is_not(None))))
    # int/float: PostgreSQL sums a BIGINT column as NUMERIC (a Decimal).
    return Charges([(kind, int(micro or 0), float(secs or 0.0)) for kind, micro, secs in kinds], ids)


def run_ledger(factory: Factory, run_id: int, charges: Charges | None = None) -> dict:
    """A run's charges by kind, and its share of its sessions' idle time: each session's idle money before its last
    work (`SessionLedger.spread_micro_usd`), split over the successful videos of all the runs it served, in
    proportion to this run's. `charges`: the run's, if already read
    (jobs.reports.postgres reads them through each video's index)."""
    if charges is None:
        with factory() as s:
            charges = run_charges(s, run_id)
    by_kind = {kind: micro for kind, micro, _ in charges.by_kind}
    # Worker time charged to the run, and what it was charged at: the records' own rates, so a report made after
    # the rate setting changed keeps the run's numbers.
    timed = [(micro, secs) for _, micro, secs in charges.by_kind if secs]
    ids = charges.sessions
    micro = seconds = up = charged = 0.0
    for ledger in sessions(factory, ids):
        up, charged = up + ledger.up_s, charged + ledger.charged_s
        served = sum(ledger.runs.values()) + ledger.pruned_videos
        mine = ledger.runs.get(run_id, 0)
        if served and mine:
            micro += ledger.spread_micro_usd * mine / served
            seconds += ledger.spread_s * mine / served
    return {"idle_usd": micro / 1e6, "idle_s": seconds, "sessions": len(ids),
            # The utilisation of the workers that served the run (over all they did): charged over up seconds.
            "utilisation": charged / up if up > 0 else None,
            "usd_per_charged_s": (sum(m for m, _ in timed) / 1e6 / sum(s for _, s in timed)) if timed else None,
            "by_kind_usd": {kind: m / 1e6 for kind, m in sorted(by_kind.items())}}
