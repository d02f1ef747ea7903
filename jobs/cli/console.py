"""What every CLI module shares: the two consoles and the one way a user error ends a command."""

from __future__ import annotations

import typer
from rich.console import Console

from jobs.errors import ReelbatchError

out = Console()
err = Console(stderr=True)


def fail(exc: ReelbatchError) -> None:
    """Print a user error (no traceback) to stderr and exit with its code (2 for bad input)."""
    err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(exc.exit_code)
