"""`reelbatch status`, `cancel` and `resume`: what runs there are, and stopping or restarting one."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from jobs.cli.console import emit_json, fail, out
from jobs.db import queries
from jobs.db.connect import session_factory
from jobs.errors import ReelbatchError
from jobs.settings import Settings

RunArg = Annotated[str, typer.Argument(help="Run name or id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def cancel(run: RunArg) -> None:
    """Cancel a run: pending videos now, running batches at their next step. Idempotent."""
    try:
        name, count = queries.cancel_run(session_factory(Settings.from_env().database_url), run)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {name}: {count} pending videos cancelled; running batches stop at their next step")


def resume(run: RunArg) -> None:
    """Put a run's failed and cancelled videos back in the queue, with fresh attempts. Idempotent."""
    try:
        settings = Settings.from_env()
        factory = session_factory(settings.database_url)
        name, count = queries.resume_run(factory, run)
        if count:
            from jobs.work.app import create_app  # here, not at the top: Celery only when tickets are sent
            from jobs.work.tickets import send_tickets

            (resumed,) = queries.run_counts(factory, name)
            send_tickets(create_app(settings), count, resumed.model)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {name}: {count} videos back in the queue")


def status(run: Annotated[Optional[str], typer.Argument(help="Run name or id (default: all runs).")] = None,
           json_: JsonOpt = False) -> None:
    """Runs and their video counts by status, and pending work that no live worker serves."""
    try:
        settings = Settings.from_env()
        factory = session_factory(settings.database_url)
        rows = queries.run_counts(factory, run)
        # Live: heartbeated within three leases, the span after which a sweeper closes a silent worker's session.
        unserved = queries.unserved_pending(factory, 3 * settings.lease_s)
    except ReelbatchError as exc:
        fail(exc)
    if run is not None:  # this run's pending videos only
        unserved = {r.model: r.counts["pending"] for r in rows if r.model in unserved and r.counts["pending"]}
    if json_:
        emit_json({"runs": [
            {"run_id": r.run_id, "name": r.name, "model": r.model, "created_at": r.created_at.isoformat(),
             "total": r.total, "counts": r.counts} for r in rows], "unserved": unserved})
        return

    table = Table("run", "name", "model", "total", "pending", "running", "succeeded", "failed", "cancelled",
                  box=None, pad_edge=False)
    for r in rows:
        table.add_row(str(r.run_id), r.name, r.model, str(r.total), *(str(r.counts[k]) for k in
                      ("pending", "running", "succeeded", "failed", "cancelled")))
    out.print(table)
    for model, n in unserved.items():
        out.print(f"{n} pending: no live worker serves {model}", highlight=False)
