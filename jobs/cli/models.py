"""`reelbatch models`: every model a manifest may name, with where it is registered, its folder, family, native
defaults, precision, adapters, image conditioning and gate state (jobs.usecases.models)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from jobs.cli.console import emit_json, fail, out
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases.models import list_models

_HEADERS = ("model", "from", "family", "size", "fps", "seconds", "frames", "steps", "guidance", "precision",
            "adapters", "image", "gate", "folder")


def models_cmd(json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts: a list of "
                                                   "objects, one per model.")] = False) -> None:
    """The built-in models and each entry of the models file (REELBATCH_MODELS), by name: where each is registered
    (built-in, or FILE:LINE), its family and folder, the defaults a manifest inherits, how it renders, and the
    state of its quality gate where one applies (a distilled registration, a lossy precision)."""
    try:
        found = list_models(Settings.from_env())
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        emit_json([m.to_dict() for m in found])
        return
    table = Table(*_HEADERS, box=None, pad_edge=False)
    for m in found:
        d = m.defaults
        precision = m.precision + (f" (text encoder {m.text_encoder_precision})" if m.text_encoder_precision else "")
        table.add_row(m.name, m.source, m.family, f"{d.width}x{d.height}", str(d.fps), f"{d.duration_s:g}",
                      str(d.frames), str(d.steps), f"{d.guidance:g}", precision,
                      ", ".join(Path(a.path).name for a in m.adapters) or "-", m.image_condition or "-",
                      "; ".join(f"{g.setting}: {g.state}" for g in m.gates) or "-", m.path)
    out.print(table)
