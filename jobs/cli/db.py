"""`reelbatch db upgrade`: the database schema, by Alembic migrations."""

from __future__ import annotations

from typing import Annotated

import typer

from jobs.cli.console import out
from jobs.db.connect import upgrade
from jobs.settings import Settings

db_app = typer.Typer(help="Database schema.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply Alembic migrations up to REVISION (default: head)."""
    url = Settings.from_env().database_url
    upgrade(url, revision)
    out.print(f"database upgraded to {revision}")
