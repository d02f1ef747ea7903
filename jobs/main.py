"""The `reelbatch` program: the command line (jobs.cli) and, above it, `serve` (jobs.service), which reuses the
commands' own functions and so stands on the CLI's floor rather than under it."""

from __future__ import annotations

import sys

from jobs.cli import app
from jobs.cli.console import err
from jobs.cli.unreachable import translate
from jobs.errors import ReelbatchError
from jobs.service.command import serve

app.command(help=serve.__doc__)(serve)


def main() -> None:
    """Run the command line; a database, broker or store that cannot be parsed or reached ends it with one line
    (jobs.cli.unreachable), exit 2."""
    try:
        app(prog_name="reelbatch")
    except ReelbatchError as exc:  # a command that did not end its own user error
        err.print(str(exc), highlight=False)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - every other exception is re-raised as it was
        message = translate(exc)
        if message is None:
            raise
        err.print(str(message), highlight=False)
        sys.exit(message.exit_code)


__all__ = ["app", "main"]
