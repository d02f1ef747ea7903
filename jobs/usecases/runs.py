"""A run's life after submit: its status (counts by state, deadline, budget), cancel, resume and a new budget.
What `reelbatch status|cancel|resume|budget` and the API's run routes do. Given a team, a use case acts on that
team's runs only (another team's run reads as one that does not exist); without one, on any run (the operator's
command line)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select

from jobs.db import limits, queries, teams
from jobs.db.base import as_utc, utcnow
from jobs.db.rows import Run
from jobs.db.teams import TeamInfo, TeamUsage
from jobs.errors import UsageError
from jobs.manifest.fields import check_max_cost
from jobs.manifest.values import FieldError
from jobs.manifest.yaml_read import yaml_scalar
from jobs.notify.finished import run_finished
from jobs.settings import Settings
from jobs.usecases.database import read_factory, snapshot_factory
from jobs.work.deadlines import QueueSnapshot, project


def _name(settings: Settings, run: str, team: TeamInfo | None) -> str:
    """The run's name, once the team (if any) is known to own it."""
    if team is None:
        return run
    return teams.owned_run(snapshot_factory(settings), team, run).name


@dataclass(frozen=True)
class Status:
    """`status --json`: each run's entry, the pending work no live worker serves (model -> videos), the teams' usage
    (all runs, the operator's view only) and the models whose live workers lack a gate."""

    runs: list[dict]
    unserved: dict[str, int] = field(default_factory=dict)
    teams: list[TeamUsage] = field(default_factory=list)
    ungated: set[str] = field(default_factory=set)
    # A page (`limit`): the id to ask for the runs before these with (`before`), None when there are none.
    next_before: int | None = None


def status(settings: Settings, run: str | None = None, team: TeamInfo | None = None,
           queue: QueueSnapshot | None = None, limit: int | None = None, before: int | None = None) -> Status:
    """`queue`: a long-lived process's recent read of the whole queue, for the work ahead of these runs. `limit`:
    the newest that many runs with an id under `before`, and where the page before them starts."""
    factory = snapshot_factory(settings)
    name = None if run is None else _name(settings, run, team)
    owner = () if team is None else (team.owns,)
    rows = queries.run_counts(factory, name, owner=owner, limit=None if limit is None else limit + 1, before=before)
    more = limit is not None and len(rows) > limit
    rows = rows[1:] if more else rows
    plans = run_plans(settings, [r.run_id for r in rows], queue)
    runs = [{"run_id": r.run_id, "name": r.name, "model": r.model, "created_at": r.created_at.isoformat(),
             "total": r.total, "counts": r.counts, "flagged": r.flagged, **plans[r.run_id]} for r in rows]
    next_before = runs[0]["run_id"] if more else None
    if team is not None:  # a team sees its runs; what the fleet serves and the other teams' usage are the operator's
        return Status(runs, next_before=next_before)
    # Live: heartbeated within three leases, the span after which a sweeper closes a silent worker's session.
    unserved = queries.unserved_pending(factory, 3 * settings.limits.lease_s)
    usage = teams.usage(factory) if run is None else []
    ungated = queries.ungated_models(factory, 3 * settings.limits.lease_s) & set(unserved)
    if run is not None:  # this run's pending videos only
        unserved = {r.model: r.counts["pending"] for r in rows if r.model in unserved and r.counts["pending"]}
    return Status(runs, unserved, usage, ungated, next_before)


def run_plans(settings: Settings, run_ids: list[int], queue: QueueSnapshot | None = None) -> dict[int, dict]:
    """Each run's deadline, projected finish (runs with work left: jobs.work.deadlines) and cost cap."""
    factory = snapshot_factory(settings)
    now = utcnow()
    with factory() as s:
        runs = list(s.scalars(select(Run).where(Run.id.in_(run_ids))))
        charged = {r.id: limits.charged_micro_usd(s, r.id) for r in runs if r.max_cost_micro_usd is not None}
    found = project(factory, settings, now, runs, queue=queue)
    out = {}
    for r in runs:
        p = found.get(r.id)
        out[r.id] = {
            "deadline": as_utc(r.deadline).isoformat() if r.deadline else None,
            "expired": r.expired_at is not None,
            "projected_finish": p.finishes_at.isoformat() if p and p.finishes_at else None,
            "slack_s": p.slack_s if p else None, "at_risk": p.at_risk if p else None,
            "max_cost_usd": r.max_cost_micro_usd / 1e6 if r.max_cost_micro_usd is not None else None,
            "charged_usd": charged[r.id] / 1e6 if r.id in charged else None,
            "budget_reached": r.budget_reached_at is not None,
        }
    return out


@dataclass(frozen=True)
class Changed:
    """A run changed: its name and how many videos moved (cancelled, or back in the queue)."""

    name: str
    videos: int
    model: str | None = None  # the run's model, when videos moved back into the queue


def cancel(settings: Settings, run: str, team: TeamInfo | None = None) -> Changed:
    """Pending videos cancelled now, running batches at their next step. Idempotent."""
    factory = read_factory(settings)
    name, count = queries.cancel_run(factory, _name(settings, run, team))
    # A run whose videos were all waiting is finished now: its result files and webhook, from here.
    run_finished(settings, factory, [name])
    return Changed(name, count)


def resume(settings: Settings, run: str, team: TeamInfo | None = None, tickets: int | None = None) -> Changed:
    """Failed and cancelled videos back in the queue, with fresh attempts. Idempotent. `tickets`: send at most this
    many of its tickets now (None: all); the service sends the rest after answering."""
    factory = read_factory(settings)
    name, count = queries.resume_run(factory, _name(settings, run, team))
    model = None
    if count:
        from jobs.work.app import create_app  # here, not at the top: Celery only when tickets are sent
        from jobs.work.tickets import send_tickets

        (resumed,) = queries.run_counts(factory, name)
        model = resumed.model
        send_tickets(create_app(settings), count if tickets is None else min(count, tickets), model)
    return Changed(name, count, model)


@dataclass(frozen=True)
class Budget:
    name: str
    max_cost_usd: float | None
    charged_usd: float
    requeued: int


def parse_usd(raw: str) -> float | None:
    """A budget as typed: a number by the manifest's number rule, or `none` for no cap."""
    if raw.strip().lower() == "none":
        return None
    try:
        value, text = yaml_scalar(raw)
        return check_max_cost(value, text)
    except FieldError as exc:
        raise UsageError(f"USD: {exc}") from None


def change_budget(settings: Settings, run: str, cap: float | None, team: TeamInfo | None = None) -> Budget:
    """The run's cost cap set (None: no cap); videos the old cap cancelled go back in the queue."""
    change = limits.set_budget(read_factory(settings), _name(settings, run, team), cap)
    if change.requeued:
        from jobs.work.app import create_app  # here, not at the top: Celery only when tickets are sent
        from jobs.work.tickets import send_tickets

        send_tickets(create_app(settings), change.requeued)
    return Budget(change.name, cap, change.charged_usd, change.requeued)
