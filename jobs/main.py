"""The `reelbatch` program: the command line (jobs.cli) and, above it, `serve` (jobs.service), which reuses the
commands' own functions and so stands on the CLI's floor rather than under it."""

from __future__ import annotations

from jobs.cli import app
from jobs.service.command import serve

app.command(help=serve.__doc__)(serve)

__all__ = ["app"]
