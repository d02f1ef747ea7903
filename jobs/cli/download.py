"""`reelbatch download RUN DIR`: a run's MP4s (checksums checked), posters and result files fetched to a folder
(jobs.usecases.download)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from jobs.cli.console import ShownFeedback, emit_json, err, fail, note_database, out
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases import download as use

# An unfinished run's download: what is done is here, the rest is not yet (a script reads it from the exit code).
UNFINISHED = 1


def download(run: Annotated[str, typer.Argument(help="Run name or id.")],
             folder: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to write to (made if absent).")],
             json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False) -> None:
    """Fetch a run's MP4s (each checked against the SHA-256 the database recorded), posters, results.jsonl and
    errors.jsonl into DIR; files already there with the right bytes are skipped. Exit 0 when the run has finished
    and all it stored is in DIR, 1 when it has videos still pending or running (what is done is fetched)."""
    try:
        settings = Settings.from_env()
        note_database(settings)
        # A bar only on a terminal: in a log or a pipe, an error stays the one line it is.
        shown = err.is_terminal and not json_
        got = use.download(settings, run, folder, feedback=ShownFeedback() if shown else use.SILENT)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        emit_json({"run": got.run, "folder": str(got.folder), "written": got.written, "skipped": got.skipped,
                   "missing": got.missing, "absent": got.absent, "finished": got.finished})
    else:
        out.print(f"run {got.run}: {len(got.written)} files written, {len(got.skipped)} already in {got.folder}"
                  + (" (nothing to write)" if got.skipped and not got.written else ""), highlight=False)
        if got.missing:
            why = ", ".join(f"{n} {state}" for state, n in got.missing.items())
            out.print(f"{sum(got.missing.values())} videos have no MP4: {why}", highlight=False)
        for name in got.absent:
            err.print(f"{name}: not in the store yet (written when the run's last video ends)", highlight=False)
    if not got.finished:
        err.print(f"run {got.run} is not finished: download again when it ends", highlight=False)
        raise typer.Exit(UNFINISHED)
