"""`reelbatch status`, `cancel` and `resume`: what runs there are (with their deadlines and cost caps), and stopping or
restarting one."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer
from rich.table import Table
from sqlalchemy import select

from jobs.cli.console import emit_json, fail, out
from jobs.db import limits, queries, teams
from jobs.db.base import as_utc, utcnow
from jobs.db.connect import session_factory
from jobs.db.rows import Run
from jobs.errors import ReelbatchError
from jobs.notify.finished import run_finished
from jobs.settings import Settings
from jobs.work.deadlines import project

RunArg = Annotated[str, typer.Argument(help="Run name or id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def cancel(run: RunArg) -> None:
    """Cancel a run: pending videos now, running batches at their next step. Idempotent."""
    try:
        name, count = cancel_and_finish(Settings.from_env(), run)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {name}: {count} pending videos cancelled; running batches stop at their next step")


def resume(run: RunArg) -> None:
    """Put a run's failed and cancelled videos back in the queue, with fresh attempts. Idempotent."""
    try:
        name, count = resume_and_queue(Settings.from_env(), run)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {name}: {count} videos back in the queue")


def cancel_and_finish(settings: Settings, run: str) -> tuple[str, int]:
    """What `cancel` does, for it and for the HTTP API (jobs.service): (the run's name, videos cancelled)."""
    factory = session_factory(settings.database_url)
    name, count = queries.cancel_run(factory, run)
    # A run whose videos were all waiting is finished now: its result files and webhook, from here.
    run_finished(settings, factory, [name])
    return name, count


def resume_and_queue(settings: Settings, run: str) -> tuple[str, int]:
    """What `resume` does, for it and for the HTTP API (jobs.service): (the run's name, videos put back)."""
    factory = session_factory(settings.database_url)
    name, count = queries.resume_run(factory, run)
    if count:
        from jobs.work.app import create_app  # here, not at the top: Celery only when tickets are sent
        from jobs.work.tickets import send_tickets

        (resumed,) = queries.run_counts(factory, name)
        send_tickets(create_app(settings), count, resumed.model)
    return name, count


def status(run: Annotated[Optional[str], typer.Argument(help="Run name or id (default: all runs).")] = None,
           json_: JsonOpt = False) -> None:
    """Runs and their video counts by status (and how many their checks flagged), and pending work that no live
    worker serves; for a run with a deadline or a cost cap, its projected finish against its deadline (flagged when
    at risk) and what it has been charged against its cap."""
    try:
        settings = Settings.from_env()
        factory = session_factory(settings.database_url)
        rows = queries.run_counts(factory, run)
        plans = run_plans(factory, settings, [r.run_id for r in rows])
        # Live: heartbeated within three leases, the span after which a sweeper closes a silent worker's session.
        unserved = queries.unserved_pending(factory, 3 * settings.limits.lease_s)
        usage = teams.usage(factory) if run is None else []
        ungated = queries.ungated_models(factory, 3 * settings.limits.lease_s) & set(unserved)
    except ReelbatchError as exc:
        fail(exc)
    if run is not None:  # this run's pending videos only
        unserved = {r.model: r.counts["pending"] for r in rows if r.model in unserved and r.counts["pending"]}
    if json_:
        emit_json({"runs": [
            {"run_id": r.run_id, "name": r.name, "model": r.model, "created_at": r.created_at.isoformat(),
             "total": r.total, "counts": r.counts, "flagged": r.flagged, **plans[r.run_id]} for r in rows], "unserved": unserved,
            "teams": [dataclasses.asdict(u) for u in usage],
            "ungated": sorted(ungated & set(unserved))})
        return

    # Kept within an 80-column terminal: the counts in one table, a run's deadline and cost cap in a second one (both
    # in one would cut every column short there); "flag" (videos their checks flagged) only when a listed run has any.
    flagged = any(r.flagged for r in rows)
    table = Table("run", "name", "model", "total", "pending", "running", "succeeded", "failed", "cancelled",
                  *(["flag"] if flagged else []), box=None, pad_edge=False)
    table.columns[1].overflow = table.columns[2].overflow = "fold"  # a name is shown whole, never cut short
    for r in rows:
        table.add_row(str(r.run_id), r.name, r.model, str(r.total), *(str(r.counts[k]) for k in
                      ("pending", "running", "succeeded", "failed", "cancelled")),
                      *([str(r.flagged)] if flagged else []))
    out.print(table)
    deadlines = any(p["deadline"] for p in plans.values())
    budgets = any(p["max_cost_usd"] is not None for p in plans.values())
    if deadlines or budgets:
        plan = Table("run", "name", box=None, pad_edge=False)
        plan.columns[1].overflow = "fold"
        if deadlines:
            plan.add_column("finish")
            plan.add_column("deadline")
        if budgets:
            plan.add_column("budget")
        for r in rows:
            p = plans[r.run_id]
            if not (p["deadline"] or p["max_cost_usd"] is not None):
                continue
            extra = [_finish_text(p), _deadline_text(p)] if deadlines else []
            if budgets:
                extra.append(_budget_text(p))
            plan.add_row(str(r.run_id), r.name, *extra)
        out.print(plan)
    for model, n in unserved.items():
        if model in ungated:  # a live worker would serve it but lacks its quality gate (jobs.render.serving)
            out.print(f"{n} pending: unserved: no gate for {model} on any worker", highlight=False)
        else:
            out.print(f"{n} pending: no live worker serves {model}", highlight=False)
    if any(u.team != teams.DEFAULT for u in usage):  # once teams share the fleet (docs/SERVICE.md)
        shares = Table("team", "share", "running", "queued", "month $", "max GPUs", "monthly $", box=None,
                       pad_edge=False)
        for u in usage:
            shares.add_row(u.team, f"{u.share:g}", str(u.running), str(u.queued), f"{u.month_usd:.6f}",
                           "" if u.max_gpus is None else str(u.max_gpus),
                           "" if u.monthly_usd is None else f"{u.monthly_usd:g}")
        out.print(shares)


def run_plans(factory, settings: Settings, run_ids: list[int]) -> dict[int, dict]:
    """Each run's deadline, projected finish (runs with work left: jobs.work.deadlines) and cost cap."""
    now = utcnow()
    with factory() as s:
        runs = list(s.scalars(select(Run).where(Run.id.in_(run_ids))))
        charged = {r.id: limits.charged_micro_usd(s, r.id) for r in runs if r.max_cost_micro_usd is not None}
    found = project(factory, settings, now, runs)
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


def _clock(iso: str | None) -> str:
    return "" if iso is None else iso[:19].replace("T", " ") + "Z"


def _finish_text(p: dict) -> str:
    return _clock(p["projected_finish"])


def _deadline_text(p: dict) -> str:
    if not p["deadline"]:
        return ""
    flag = "expired" if p["expired"] else {True: "AT RISK", False: "on time", None: ""}[p["at_risk"]]
    # The verdict first: wrapped in a narrow column, it stays whole on the first line.
    return f"{flag} {_clock(p['deadline'])}".strip()


def _budget_text(p: dict) -> str:
    if p["max_cost_usd"] is None:
        return ""
    return f"${p['charged_usd']:.4f} of ${p['max_cost_usd']:g}" + (" reached" if p["budget_reached"] else "")
