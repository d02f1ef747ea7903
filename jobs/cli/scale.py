"""`reelbatch scale`: how many workers each model's queue wants now, which live workers may go, and (`--sql`) the
same count as one statement for KEDA's PostgreSQL scaler."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.table import Table

from jobs.cli.console import emit_json, fail, out
from jobs.cost.scale import COLD_START_S, DRAIN_HORIZON_S
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases import scale as scaling


def scale(
    model: Annotated[Optional[str], typer.Option(help="One model's count (default: every model's, summed).")] = None,
    horizon_s: Annotated[float, typer.Option("--horizon-s", help="Seconds a backlog should drain in.")] = DRAIN_HORIZON_S,
    cold_start_s: Annotated[Optional[float], typer.Option(
        "--cold-start-s", help="Seconds from a worker's start to its first video, taken off the time left to each "
                               "deadline (default: the median recent workers measured, else "
                               f"{COLD_START_S:g}).")] = None,
    sql: Annotated[bool, typer.Option("--sql", help="Print the count as one PostgreSQL statement (KEDA's "
                                      "postgresql scaler) with these figures written in, and read nothing.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")] = False,
) -> None:
    """Workers wanted per model: the most of those busy now, the backlog's GPU seconds over --horizon-s, and each
    deadline's work over its time left less --cold-start-s (one while any work waits); and the hosts whose every
    worker is idle, which a scale-down may stop."""
    try:
        if sql:
            sys.stdout.write(scaling.keda_query(horizon_s, COLD_START_S if cold_start_s is None else cold_start_s,
                                                model) + "\n")
            return
        found = scaling.scale(Settings.from_env(), horizon_s, cold_start_s, model)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        emit_json(found.to_dict())
        return
    out.print(f"desired workers: {found.desired} (drain horizon {found.horizon_s:g} s, cold start "
              f"{found.cold_start_s:g} s, {found.cold_start_source})", highlight=False)
    if found.models:
        table = Table("model", "desired", "busy", "backlog GPU-s", "for backlog", "for deadline", "units",
                      "unmeasured", box=None, pad_edge=False)
        for m in found.models:
            table.add_row(m.model, str(m.desired), str(m.busy), f"{m.backlog_s:.1f}", str(m.backlog_workers),
                          f"{m.deadline_workers} (by {m.deadline})" if m.deadline else "0", str(m.units),
                          str(m.unmeasured_units))
        out.print(table)
    else:
        out.print("no work pending or claimed", highlight=False)
    if found.workers:
        table = Table("worker", "state", "leases", "last seen", box=None, pad_edge=False)
        for w in found.workers:
            table.add_row(w.owner, "busy" if w.busy else "idle", str(w.leases), w.last_seen_at)
        out.print(table)
    out.print("may go (every worker idle): " + (", ".join(found.may_go) or "none"), highlight=False)
