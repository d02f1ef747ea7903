"""The `reelbatch` command line: one Typer app, a sub-app or command per noun (jobs.cli.app assembles them)."""

from jobs.cli.app import app

__all__ = ["app"]
