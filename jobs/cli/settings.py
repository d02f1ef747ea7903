"""`reelbatch settings`: the settings this process reads, each with where its value came from, or the reference
table docs/SETTINGS.md holds (made from the same table, jobs.settings.VARIABLES)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from jobs.cli.console import fail, out
from jobs.errors import ReelbatchError
from jobs.settings import VARIABLES, Settings, markdown_table


def settings_cmd(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the reference table (docs/SETTINGS.md's).")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")] = False,
) -> None:
    """Every REELBATCH_ setting as this process reads it: its value, and whether the environment set it."""
    if markdown:
        typer.echo(markdown_table(), nl=False)
        return
    try:
        settings = Settings.from_env()
    except ReelbatchError as exc:
        fail(exc)
    rows = [{"variable": v.name, "value": _shown(v, settings.value(v.field)),
             "set": bool((os.environ.get(v.name) or "").strip())} for v in VARIABLES]
    if json_:
        out.print_json(json.dumps({"settings": rows}))
        return
    table = Table("variable", "value", "from", box=None, pad_edge=False)
    for row in rows:
        table.add_row(row["variable"], str(row["value"]), "environment" if row["set"] else "default")
    out.print(table, markup=False, highlight=False)


def _shown(variable, value: object) -> object:
    if variable.secret:
        return None if value is None else "(set, not shown)"
    return _plain(value)


def _plain(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value
