"""What every CLI module shares: the two consoles and the one way a user error ends a command."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console

from jobs.errors import ReelbatchError

out = Console()
err = Console(stderr=True)


def fail(exc: ReelbatchError) -> None:
    """Print a user error (no traceback) to stderr and exit with its code (2 for bad input)."""
    err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(exc.exit_code)


def emit_json(data: object) -> None:
    """Print JSON for scripts: one line, by the json module's C encoder. rich's print_json (indented, highlighted)
    took 7 s for 5,000 videos, and json.dumps with an indent runs the module's Python encoder: a 100,000-video report
    spent most of its time there (docs/SCALE.md)."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
