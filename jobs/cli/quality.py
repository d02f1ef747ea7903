"""`reelbatch quality`: prompt adherence and drift from the reference renders, for a model that draws the toy world.

jobs.cli.app registers it with `app.command()(quality)`.
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobs.cli.console import fail, out
from jobs.errors import ReelbatchError
from jobs.quality.evaluate import REFERENCES, SAMPLE_SIZE, QualityReport, evaluate, native_shape, sample_set
from jobs.settings import Settings


def quality(
    model: Annotated[str, typer.Option("--model", help="A registered model trained on the toy world.")] = "toy",
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, max=200, help="Default: the model's.")] = None,
    guidance: Annotated[Optional[float], typer.Option("--guidance", min=0, max=30, help="Default: the model's.")] = None,
    count: Annotated[int, typer.Option("--count", min=16, max=400,
                                       help="Videos in the sample set; 80 holds every prompt once.")] = SAMPLE_SIZE,
    batch: Annotated[int, typer.Option("--batch", min=1, max=64, help="Videos per engine call.")] = 8,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")] = False,
) -> None:
    """Render a fixed set of toy-world prompts, judge each MP4 from its pixels, and compare the frames with the
    model's reference renders. Exits 1 when adherence misses a target or the frames drift below 40 dB PSNR."""
    try:
        report = run_quality(Settings.from_env(), model, steps, guidance, count, batch, show_progress=not json_)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(report.to_dict()))
    else:
        print_quality(report)
    if not report.passed:
        raise typer.Exit(1)


def run_quality(settings: Settings, model: str, steps: int | None, guidance: float | None, count: int, batch: int,
                show_progress: bool = False) -> QualityReport:
    from engine.engine import Engine

    registry = settings.registry()
    shape, fps = native_shape(registry, model, steps=steps, guidance=guidance)
    info = registry.get(model)
    engine = Engine(settings.engine_config(), registry)
    cases = sample_set(count)
    references = info.path / REFERENCES if info.path else None
    if not show_progress:
        return evaluate(engine, shape, cases, fps=fps, batch=batch, references=references)
    with Progress(TextColumn("rendering"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=out, transient=True) as bar:
        task = bar.add_task("quality", total=len(cases))
        return evaluate(engine, shape, cases, fps=fps, batch=batch, references=references,
                        on_batch=lambda n: bar.advance(task, n))


def print_quality(report: QualityReport) -> None:
    s = report.shape
    out.print(f"{report.model}: {report.count} videos, {s['width']}x{s['height']}, {s['frames']} frames, "
              f"{s['steps']} steps, guidance {s['guidance']:g}, judged after the MP4 round trip "
              f"({report.seconds:.0f} s)", highlight=False)
    table = Table("attribute", "adherence", "target", "")
    for name, value in report.adherence.items():
        target = report.targets.get(name)
        verdict = "" if target is None else ("ok" if value >= target else "MISSED")
        table.add_row(name, f"{value:.1%}", "" if target is None else f">= {target:.0%}", verdict)
    out.print(table)
    ref = report.reference
    if ref.get("available"):
        verdict = "ok" if ref["matches"] else "DRIFTED"
        out.print(f"against the reference renders: PSNR min {ref['psnr_db_min']:.1f} dB (mean "
                  f"{ref['psnr_db_mean']:.1f}; >= {ref['threshold_db']:g} required), SSIM min {ref['ssim_min']:.4f} "
                  f"{verdict}", highlight=False)
    else:
        out.print(f"no reference comparison: {ref.get('why')}", highlight=False)
    out.print("PASSED" if report.passed else "FAILED", highlight=False)
