"""`reelbatch schedule add|list|remove` and `reelbatch beat`: manifests rendered on a cron schedule.

jobs.cli.app registers these with `app.add_typer(schedule_app, name="schedule")` and `app.command()(beat)`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Optional

import typer

from jobs.cli.console import fail, literal, out
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases import schedules
from jobs.work.schedules import FiringResult, ScheduleInfo

schedule_app = typer.Typer(help="Manifests submitted on a cron schedule (UTC); `reelbatch beat` fires them.",
                           no_args_is_help=True)

NameArg = Annotated[str, typer.Argument(help="Schedule name; each firing's run is named NAME-YYYYmmddTHHMMSSZ.")]


def _when(t: datetime | None) -> str:
    return "never" if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")


@schedule_app.command("add")
def add(
    name: NameArg,
    manifest: Annotated[str, typer.Option("--manifest", help="A manifest file (.yaml/.yml/.jsonl) on a path every "
                                          "worker can read, or s3://BUCKET/KEY; read again at every firing.")],
    cron: Annotated[str, typer.Option("--cron", help="When, in UTC: 5 cron fields ('0 2 * * *' is 02:00 daily), "
                                      "or 6 with seconds last.")],
    notify: Annotated[Optional[str], typer.Option("--notify", help="Webhook URL each run POSTs a signed summary to "
                                                  "when it finishes (over the manifest's own `notify`).")] = None,
) -> None:
    """Add a schedule: at each cron time a worker submits the manifest as run NAME-YYYYmmddTHHMMSSZ."""
    try:
        info = schedules.add_schedule(Settings.from_env(), name, manifest, cron, notify=notify)
    except ReelbatchError as exc:
        fail(exc)
    hook = f"; each run notifies {info.notify}" if info.notify else ""
    out.print(f"schedule {info.name} added: {info.manifest} at '{info.cron}' (UTC); next firing "
              f"{_when(info.next_fire_time)}{hook}", markup=False, highlight=False, soft_wrap=True)


@schedule_app.command("list")
def list_(json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")] = False
          ) -> None:
    """Schedules, their next fire time and their last firing's outcome (with its errors if it failed)."""
    try:
        rows = schedules.list_schedules(Settings.from_env())
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"schedules": [_schedule_dict(r) for r in rows]}))
        return
    from rich.table import Table

    table = Table("name", "cron (UTC)", "manifest", "next firing", "last firing", "outcome", box=None,
                  pad_edge=False)
    for column in table.columns:
        column.overflow = "fold"  # a long path or error is wrapped, not cut off
    for r in rows:
        last = r.last_firing
        cells = (r.name, r.cron, r.manifest, _when(r.next_fire_time), _when(last and last.fire_time),
                 "" if last is None else _outcome(last))
        table.add_row(*map(literal, cells))  # a path or an error is shown as written, never read as markup
    out.print(table)


def _outcome(f: FiringResult) -> str:
    if f.state == "ok":
        return f"ok: run {f.run_name}" + ("" if f.run_id is not None else " (since deleted)")
    if f.state == "failed":
        lines = f.errors.splitlines()
        more = f" (+{len(lines) - 1} more: `reelbatch schedule list --json`)" if len(lines) > 1 else ""
        return f"failed: {lines[0] if lines else ''}{more}"
    return "in progress"


def _schedule_dict(r: ScheduleInfo) -> dict:
    f = r.last_firing
    return {"name": r.name, "manifest": r.manifest, "cron": r.cron, "notify": r.notify,
            "created_at": r.created_at.isoformat(),
            "next_fire_time": r.next_fire_time and r.next_fire_time.isoformat(),
            "last_firing": None if f is None else {
                "fire_time": f.fire_time.isoformat(), "state": f.state, "ok": f.ok, "run_id": f.run_id,
                "run_name": f.run_name, "errors": f.errors}}


@schedule_app.command("remove")
def remove(name: NameArg) -> None:
    """Remove a schedule and its firing history. The runs it made stay."""
    try:
        schedules.remove_schedule(Settings.from_env(), name)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"schedule {name} removed", highlight=False)


def beat(
    interval: Annotated[float, typer.Option(min=1.0, help="Seconds between checks for due schedules.")] = 30.0,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
) -> None:
    """Run Celery beat: every --interval seconds it has a worker fire the schedules that are due.

    One beat is enough; more are safe (each fire time makes one run, whoever fires it).
    """
    try:
        settings = Settings.from_env()
        schedules.check_database(settings)  # refuse to start against a schema this code does not know
    except ReelbatchError as exc:
        fail(exc)
    from jobs.work.app import create_app  # here, not at the top: Celery only for the command that runs the beat

    celery = create_app(settings)
    # Sent by name, so the beat never imports the tasks; the app's routes put it on the workers' control queue.
    celery.conf.beat_schedule = {"reelbatch-fire-schedules": {"task": "reelbatch.fire_schedules",
                                                              "schedule": interval}}
    # celery.beat:Scheduler keeps its state in memory, so there is no schedule file to place or share: which fire
    # times have fired is in the database, and a restarted beat only has to resume its interval.
    celery.Beat(scheduler="celery.beat:Scheduler", loglevel=loglevel).run()
