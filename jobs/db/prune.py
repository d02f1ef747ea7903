"""Removing finished runs' rows (`reelbatch prune`): a run whose every video is in a terminal state and whose last
video ended before a cutoff. Its videos, work units, cost records and notifications go with it (their foreign keys
cascade); its schedule fires keep their row with no run. The cost ledger keeps the worker time the run was charged:
before its records go, they are summed per worker session into `pruned_charges` (jobs.db.rows.PrunedCharge), which
jobs.cost.ledger reads beside the records that remain."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, delete, exists, func, select

from jobs.db.base import as_utc
from jobs.db.queries import Factory
from jobs.db.rows import CostRecord, PrunedCharge, Run, Video
from jobs.db.status import Status

_LIVE = (Status.PENDING, Status.RUNNING)


@dataclass(frozen=True)
class RunAge:
    """A run as prune sees it: its videos by status, and when its last video ended (None: none has)."""

    run_id: int
    name: str
    output: str
    counts: dict[str, int]
    ended_at: datetime | None

    @property
    def finished(self) -> bool:
        return not any(self.counts.get(st.value) for st in _LIVE)


def run_ages(factory: Factory) -> list[RunAge]:
    """Every run, in id order, with its counts and end: two grouped reads, whatever the runs' sizes."""
    with factory() as s:
        runs = s.execute(select(Run.id, Run.name, Run.output, Run.created_at).order_by(Run.id)).all()
        counts: dict[int, dict[str, int]] = {r.id: {} for r in runs}
        for run_id, status, n in s.execute(select(Video.run_id, Video.status, func.count())
                                           .group_by(Video.run_id, Video.status)):
            counts[run_id][Status(status).value] = n
        ends = dict(s.execute(select(Video.run_id, func.max(Video.finished_at)).group_by(Video.run_id)).all())
    return [RunAge(r.id, r.name, r.output, counts[r.id],
                   as_utc(ends[r.id]) if ends.get(r.id) else None) for r in runs]


@dataclass(frozen=True)
class Stored:
    """A video's objects, as the store keys them: its key in the run, and whether it has an MP4 and a poster."""

    key: str
    mp4: bool
    poster: bool


def stored_videos(factory: Factory, run_id: int) -> list[Stored]:
    with factory() as s:
        return [Stored(k, uri is not None, poster is not None) for k, uri, poster in s.execute(
            select(Video.key, Video.uri, Video.poster_uri).where(Video.run_id == run_id).order_by(Video.id))]


def remove_runs(factory: Factory, run_ids: list[int]) -> list[int]:
    """Delete the runs named (their rows cascade) that are still finished, in one transaction, their charges kept in
    the ledger first; returns the ids removed. A run resumed since it was chosen has a pending video again: it is
    left whole, and its summary is taken back in the same transaction."""
    if not run_ids:
        return []
    with factory.begin() as s:
        summed = (select(CostRecord.session_id, Video.run_id, Run.name, func.sum(CostRecord.seconds),
                         func.sum(CostRecord.amount_micro_usd),
                         func.count(func.distinct(case((Video.status == Status.SUCCEEDED, Video.id)))))
                  .join(Video, Video.id == CostRecord.video_id).join(Run, Run.id == Video.run_id)
                  .where(Video.run_id.in_(run_ids), CostRecord.session_id.is_not(None))
                  .group_by(CostRecord.session_id, Video.run_id, Run.name))
        added = [PrunedCharge(session_id=sid, run_id=rid, run_name=name, seconds=float(secs or 0.0),
                              amount_micro_usd=int(micro or 0), succeeded_videos=int(n or 0))
                 for sid, rid, name, secs, micro, n in s.execute(summed)]
        s.add_all(added)
        s.flush()
        live = exists().where(Video.run_id == Run.id, Video.status.in_(_LIVE))
        removed = list(s.scalars(delete(Run).where(Run.id.in_(run_ids), ~live).returning(Run.id)))
        kept = set(run_ids) - set(removed)
        if kept:
            s.execute(delete(PrunedCharge).where(PrunedCharge.id.in_([a.id for a in added if a.run_id in kept])))
    return sorted(removed)
