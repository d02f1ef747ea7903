"""What every CLI module shares: the two consoles, which show user text as it is, and the one way a user error ends
a command.

The consoles never read markup or emoji codes in a string, and show control and bidi characters escaped
(jobs.reports.text.visible): a manifest path, an output URI, a name or an error quoting one is printed as the user
wrote it, on stdout and stderr alike. A style is given as a Text's style, never as markup in a string; text in a
progress bar goes through `progress_text` and `visible`, since a bar builds its own Text. Lines are not wrapped by
the console (a terminal wraps them), and in a pipe a table is as wide as its text: nothing is cut short.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from jobs.errors import ReelbatchError
from jobs.reports.text import literal, visible
from jobs.usecases.database import default_note, missing_file
from jobs.usecases.feedback import Feedback

__all__ = ["ShownFeedback", "err", "fail", "literal", "note_database", "out", "progress_text", "visible"]


# Writing to a pipe or a file, Rich would lay tables out in 80 columns and cut or fold long cells; there is no screen
# to fit, so lines are as long as their text. A terminal (or COLUMNS) keeps its own width.
_UNBOUNDED = 10_000


class _LiteralConsole(Console):
    def __init__(self, stderr: bool = False) -> None:
        stream = sys.stderr if stderr else sys.stdout
        screen = "COLUMNS" in os.environ or (stream is not None and stream.isatty())
        super().__init__(stderr=stderr, markup=False, emoji=False, soft_wrap=True,
                         width=None if screen else _UNBOUNDED)

    def render_str(self, text: str, **kwargs) -> Text:
        # Every string printed or put in a table comes through here: markup and emoji stay off, whatever a call asks.
        kwargs.update(markup=False, emoji=False)
        return super().render_str(visible(text), **kwargs)


out = _LiteralConsole()
err = _LiteralConsole(stderr=True)


def progress_text() -> TextColumn:
    """A progress bar's description column: bold, never read as markup (pass descriptions through `visible`)."""
    return TextColumn("{task.description}", style="bold", markup=False)


class ShownFeedback(Feedback):
    """A use case's feedback on stderr: a phase as a spinner, a count as a progress bar."""

    @contextmanager
    def phase(self, text: str) -> Iterator[None]:
        with err.status(literal(text)):
            yield

    @contextmanager
    def count(self, text: str, total: int):
        columns = (progress_text(), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err) as bar:
            task = bar.add_task(visible(text), total=total)
            yield lambda n: bar.advance(task, n)


def show_progress(record: dict) -> None:
    """One line of a training's log record: `stage step/of: name value, ...`."""
    parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()
             if k not in ("stage", "step", "of")]
    out.print(f"{record['stage']} {record['step']}/{record['of']}: {', '.join(parts)}", highlight=False)


def fail(exc: ReelbatchError) -> None:
    """Print a user error (no traceback) to stderr and exit with its code (2 for bad input)."""
    err.print(str(exc), highlight=False)
    raise typer.Exit(exc.exit_code)


def note_database(settings) -> None:
    """On stderr (so `--json` stays clean), one line when the database read is the default file in this folder: a
    reader in the wrong folder sees which database answered."""
    note = default_note(settings)
    if note is not None and missing_file(settings.database_url) is None:
        err.print(note, markup=False, highlight=False, soft_wrap=True)


def emit_json(data: object) -> None:
    """Print JSON for scripts: one line, by the json module's C encoder. rich's print_json (indented, highlighted)
    took 7 s for 5,000 videos, and json.dumps with an indent runs the module's Python encoder: a 100,000-video report
    spent most of its time there (docs/SCALE.md)."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")


def emit_json_listing(data: dict, items: Iterable[str]) -> None:
    """Print `data` as emit_json does, with its last key's list (empty in `data`) written from `items`: chunks of JSON
    text, each the JSON of one or more items joined by ", " (a 100,000-video report's entries, written by PostgreSQL:
    jobs.reports.postgres)."""
    head = json.dumps(data, ensure_ascii=False)
    last = list(data)[-1]
    if data[last] != [] or not head.endswith(f"{json.dumps(last, ensure_ascii=False)}: []}}"):
        raise ValueError(f"emit_json_listing: the last key, {last!r}, must hold an empty list")
    sys.stdout.write(head[:-2])  # up to and with the list's "["
    for i, chunk in enumerate(items):
        sys.stdout.write(", " + chunk if i else chunk)
    sys.stdout.write("]}\n")
