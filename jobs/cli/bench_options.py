"""What `reelbatch bench`'s subcommands share: the preset and steps options (a preset chosen and checked), `--json`,
comma-separated counts, and the old mode flags (`--quality`, `--ladder`, ...) answered with the subcommand that
replaced them."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from jobs.bench.presets import PRESETS, Preset
from jobs.cli.console import fail
from jobs.errors import UsageError
from storage.codecs import PRESETS as ENCODER_PRESETS

PresetOption = Annotated[str, typer.Option("--preset", help=f"One of: {', '.join(PRESETS)}.")]
StepsOption = Annotated[Optional[int], typer.Option("--steps", min=1, max=200,
                                                    help="Denoising steps (default: the preset's).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]

# Each mode was once a flag of one `bench` command; a script that still passes one is told where it went, rather
# than having the flag parsed as something else (or refused as merely unknown).
MOVED = {"--quality": "quality", "--precision": "precision MODE...", "--fleet": "fleet", "--scale": "scale",
         "--long": "long", "--ladder": "ladder"}


def chosen_preset(name: str, steps: int | None, encoder_preset: str | None = None) -> Preset:
    """The preset `name`, with `--steps` and `--encoder-preset` over its own; a usage error naming the option."""
    if name not in PRESETS:
        fail(UsageError(f"--preset: {name!r} is not a preset (choose from {', '.join(PRESETS)})"))
    chosen = PRESETS[name] if steps is None else dataclasses.replace(PRESETS[name], steps=steps)
    if encoder_preset is not None:
        if encoder_preset not in ENCODER_PRESETS:
            fail(UsageError(f"--encoder-preset: {encoder_preset!r} is not one of {', '.join(ENCODER_PRESETS)}"))
        chosen = dataclasses.replace(chosen, encoder_preset=encoder_preset)
    return chosen


def counts(option: str, raw: str, most: int) -> tuple[int, ...]:
    """`raw` as comma-separated whole numbers from 1 to `most` (`--levels 10,20`); a usage error naming `option`."""
    try:
        values = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or not all(1 <= v <= most for v in values):
        fail(UsageError(f"{option}: expected comma-separated whole numbers from 1 to {most}, got {raw!r}"))
    return values


class BenchGroup(TyperGroup):
    """`reelbatch bench`: the side by side when no subcommand is named, else the named mode. A former mode flag
    before any subcommand (`bench --quality --count 32`) is a usage error naming the subcommand that replaced it,
    checked before the options are parsed so that the mode's own options do not fail first as unknown."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        for arg in args:
            if arg in self.commands:
                break
            flag = arg.partition("=")[0]
            if flag in MOVED:
                fail(UsageError(f"{flag}: the mode is a subcommand now: `reelbatch bench {MOVED[flag]} [OPTIONS]` "
                                f"(`reelbatch bench {MOVED[flag].split()[0]} --help` lists its options)"))
        return super().parse_args(ctx, args)
