"""`reelbatch notifications RUN`: the webhook deliveries of a run's finishes, with every attempt."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from jobs.cli.console import fail, out
from jobs.errors import ReelbatchError
from jobs.notify.outbox import NotificationInfo
from jobs.settings import Settings
from jobs.usecases.notifications import notifications


def notifications_cmd(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")] = False,
) -> None:
    """Each webhook notification of RUN (one per finish: a resume starts another), its state and every attempt:
    when, from which worker, the answer (a status code or the error) and how long it took."""
    try:
        rows = notifications(Settings.from_env(), run)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"run": run, "notifications": [_as_dict(n) for n in rows]}))
        return
    if not rows:
        out.print(f"run {run}: no notifications (no `notify`, or not finished yet)", markup=False, highlight=False)
        return
    for n in rows:
        when = {"pending": f"next attempt {_when(n.next_attempt_at)}, gives up {_when(n.give_up_at)}",
                "delivered": f"at {_when(n.delivered_at)}", "gave_up": f"after {len(n.attempts)} attempts"}[n.state]
        out.print(Text(f"run {n.run} round {n.round}: {n.state} {when}\n  delivery {n.key} to {n.url}"))
        table = Table("attempt", "at", "sender", "answer", "seconds", box=None, pad_edge=False)
        for a in n.attempts:
            answer = (f"{a.status_code} accepted" if a.accepted else a.error or str(a.status_code))
            table.add_row(str(a.number), _when(a.started_at), Text(a.sender), Text(answer), f"{a.duration_s:.3f}")
        out.print(table)


def _when(t) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")


def _as_dict(n: NotificationInfo) -> dict:
    return {"round": n.round, "delivery": n.key, "url": n.url, "state": n.state,
            "next_attempt_at": n.next_attempt_at and n.next_attempt_at.isoformat(),
            "give_up_at": n.give_up_at.isoformat(), "delivered_at": n.delivered_at and n.delivered_at.isoformat(),
            "body": json.loads(n.body),
            "attempts": [{"number": a.number, "sender": a.sender, "started_at": a.started_at.isoformat(),
                          "duration_s": a.duration_s, "status_code": a.status_code, "error": a.error,
                          "accepted": a.accepted} for a in n.attempts]}
