"""`reelbatch bench`: baseline (the plain diffusers script) and reelbatch's worker path, side by side, in one process.

jobs.cli registers it with `app.command()(bench)`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobs.bench import PRESETS, STAGES, BenchResult, run_bench
from jobs.console import err, out
from jobs.settings import Settings


def bench(
    preset: Annotated[str, typer.Option("--preset", help=f"One of: {', '.join(PRESETS)}.")] = "cpu",
    videos: Annotated[Optional[int], typer.Option("--videos", min=1, max=1000,
                                                  help="Videos per side (default: the preset's).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, max=200,
                                                 help="Denoising steps (default: the preset's).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")] = False,
) -> None:
    """Render the same videos with the script a user would write from the diffusers docs and with reelbatch's
    worker path, and print throughput, stage seconds, FLOPs, MFU and how far the outputs differ."""
    if preset not in PRESETS:
        err.print(f"--preset: {preset!r} is not a preset (choose from {', '.join(PRESETS)})")
        raise typer.Exit(2)
    chosen = PRESETS[preset] if steps is None else dataclasses.replace(PRESETS[preset], steps=steps)
    total = 2 * (videos or chosen.videos)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=json_) as bar:
        task = bar.add_task(f"bench {preset}: baseline, then reelbatch", total=total)
        result = run_bench(chosen, Settings.from_env(), videos=videos, on_video=lambda: bar.advance(task))
    if json_:
        out.print_json(json.dumps(result.to_dict()))
    else:
        print_bench(result)


def print_bench(r: BenchResult) -> None:
    b, e = r.baseline, r.engine
    out.print(f"[bold]bench {r.preset}[/bold] on {r.device} ({r.dtype}): {r.shape['videos']} videos of "
              f"{r.shape['width']}x{r.shape['height']}, {r.shape['frames']} frames, {r.shape['steps']} steps, "
              f"guidance {r.shape['guidance']:g}")
    table = Table("", "baseline", "reelbatch", "ratio")
    table.add_row("videos/hour", f"{b.videos_per_hour:.1f}", f"{e.videos_per_hour:.1f}", f"{r.speedup:.2f}x")
    table.add_row("wall s", f"{b.wall_s:.2f}", f"{e.wall_s:.2f}", _ratio(b.wall_s, e.wall_s))
    for stage in (*STAGES, "other"):
        x, y = b.stages.get(stage, 0.0), e.stages.get(stage, 0.0)
        table.add_row(f"  {stage} s", f"{x:.2f}", f"{y:.2f}", _ratio(x, y))
    table.add_row("wall / compute", f"{b.wall_s / b.compute_s:.3f}", f"{e.wall_s / e.compute_s:.3f}", "")
    table.add_row("denoise MFU", f"{r.baseline_denoise_mfu:.2f}", f"{r.denoise_mfu:.2f}", "")
    out.print(table)
    out.print(f"denoise {r.denoise_gflop:.1f} GFLOP per video; matmul peak {r.peak_gflops:.1f} GFLOP/s, so at least "
              f"{r.denoise_floor_s:.2f} s of denoising per video; "
              f"min PSNR reelbatch vs baseline {r.min_psnr_db:.1f} dB (100 = identical)")


def _ratio(baseline: float, engine: float) -> str:
    return f"{baseline / engine:.2f}x" if engine > 0 else ""
