"""`reelbatch status`, `cancel` and `resume`: what runs there are (with their deadlines and cost caps), and stopping or
restarting one."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer
from rich.table import Table

from jobs.cli.console import emit_json, fail, note_database, out
from jobs.db import teams
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases import runs

RunArg = Annotated[str, typer.Argument(help="Run name or id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def cancel(run: RunArg) -> None:
    """Cancel a run: pending videos now, running batches at their next step. Idempotent."""
    try:
        changed = runs.cancel(Settings.from_env(), run)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {changed.name}: {changed.videos} pending videos cancelled; running batches stop at their next step")


def resume(run: RunArg) -> None:
    """Put a run's failed and cancelled videos back in the queue, with fresh attempts. Idempotent."""
    try:
        changed = runs.resume(Settings.from_env(), run)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {changed.name}: {changed.videos} videos back in the queue")


def status(run: Annotated[Optional[str], typer.Argument(help="Run name or id (default: all runs).")] = None,
           json_: JsonOpt = False) -> None:
    """Runs and their video counts by status (and how many their checks flagged), and pending work that no live
    worker serves; for a run with a deadline or a cost cap, its projected finish against its deadline (flagged when
    at risk) and what it has been charged against its cap."""
    try:
        settings = Settings.from_env()
        found = runs.status(settings, run)
    except ReelbatchError as exc:
        fail(exc)
    note_database(settings)
    unserved, usage, ungated = found.unserved, found.teams, found.ungated
    if json_:
        emit_json({"runs": found.runs, "unserved": unserved, "teams": [dataclasses.asdict(u) for u in usage],
                   "ungated": sorted(ungated & set(unserved))})
        return

    # Kept within an 80-column terminal: the counts in one table, a run's deadline and cost cap in a second one (both
    # in one would cut every column short there); "flag" (videos their checks flagged) only when a listed run has any.
    rows = found.runs
    flagged = any(r["flagged"] for r in rows)
    table = Table("run", "name", "model", "total", "pending", "running", "succeeded", "failed", "cancelled",
                  *(["flag"] if flagged else []), box=None, pad_edge=False)
    table.columns[1].overflow = table.columns[2].overflow = "fold"  # a name is shown whole, never cut short
    for r in rows:
        table.add_row(str(r["run_id"]), r["name"], r["model"], str(r["total"]), *(str(r["counts"][k]) for k in
                      ("pending", "running", "succeeded", "failed", "cancelled")),
                      *([str(r["flagged"])] if flagged else []))
    out.print(table)
    deadlines = any(p["deadline"] for p in rows)
    budgets = any(p["max_cost_usd"] is not None for p in rows)
    if deadlines or budgets:
        plan = Table("run", "name", box=None, pad_edge=False)
        plan.columns[1].overflow = "fold"
        if deadlines:
            plan.add_column("finish")
            plan.add_column("deadline")
        if budgets:
            plan.add_column("budget")
        for p in rows:
            if not (p["deadline"] or p["max_cost_usd"] is not None):
                continue
            extra = [_finish_text(p), _deadline_text(p)] if deadlines else []
            if budgets:
                extra.append(_budget_text(p))
            plan.add_row(str(p["run_id"]), p["name"], *extra)
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
