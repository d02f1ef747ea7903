"""`reelbatch prune --older-than AGE`: finished runs' rows removed, their objects too with --objects
(jobs.usecases.prune)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from jobs.cli.console import emit_json, fail, note_database, out
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases import prune as use


def prune(older_than: Annotated[str, typer.Option("--older-than", metavar="AGE",
                                                  help="Remove runs that ended more than AGE ago: 30d, 12h, 90m.")],
          objects: Annotated[bool, typer.Option("--objects", help="Also delete their MP4s, posters and result "
                                                "files from the store.")] = False,
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")]
          = False,
          json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False) -> None:
    """Remove the rows of finished runs (every video succeeded, failed or cancelled) whose last video ended more than
    AGE ago; runs with videos pending or running are kept and listed. The cost ledger keeps what they were charged."""
    try:
        settings = Settings.from_env()
        age = use.parse_age(older_than)
        note_database(settings)
        done = use.prune(settings, age, objects=objects, dry_run=dry_run)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        emit_json(dataclasses.asdict(done))
        return
    verb = "would remove" if dry_run else "removed"
    for r in done.removed:
        objs = "" if r.objects is None else f", {r.objects} objects"
        out.print(f"{verb} run {r.run_id} {r.name}: {r.videos} videos{objs}, ended {r.ended_at or 'never started'}",
                  highlight=False)
    for k in done.kept:
        out.print(f"kept run {k.run_id} {k.name}: {k.why}", highlight=False)
    total = "would be removed" if dry_run else "removed"
    out.print(f"{len(done.removed)} runs {total}, {len(done.kept)} unfinished kept, {done.recent} ended within "
              f"{older_than}" + ("" if objects or not done.removed else "; their objects stay (--objects)"),
              highlight=False)
