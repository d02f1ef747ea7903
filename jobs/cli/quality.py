"""`reelbatch quality`: prompt adherence and drift from the reference renders, for a model that draws the toy world.

jobs.cli.app registers it with `app.command()(quality)`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobs.cli.console import fail, out
from jobs.errors import ReelbatchError, UsageError
from jobs.quality.sample import SAMPLE_SIZE
from jobs.settings import Settings

if TYPE_CHECKING:
    from jobs.quality.evaluate import QualityReport
    from jobs.quality.images import ImageQualityReport


def quality(
    model: Annotated[Optional[str], typer.Option("--model", help="A registered model trained on the toy world "
                                                 "(default: toy; with --images, toy-i2v).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, max=200, help="Default: the model's.")] = None,
    guidance: Annotated[Optional[float], typer.Option("--guidance", min=0, max=30, help="Default: the model's.")] = None,
    count: Annotated[int, typer.Option("--count", min=16, max=400,
                                       help="Videos in the sample set; 80 holds every prompt once.")] = SAMPLE_SIZE,
    batch: Annotated[int, typer.Option("--batch", min=1, max=64, help="Videos per engine call.")] = 8,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")] = False,
    images: Annotated[bool, typer.Option("--images", help="Start each video from a picture of the toy world "
                                         "(image/prompt/seed triples) and judge whether it is kept.")] = False,
    unseen: Annotated[bool, typer.Option("--unseen", help="With --images: pictures training never drew (other "
                                         "sizes, sub-pixel positions, other shades), the held-out set.")] = False,
    validation: Annotated[bool, typer.Option("--validation", help="With --unseen: the validation set that "
                                             "chose toy-i2v's VAE recipe, instead of the held-out set.")] = False,
) -> None:
    """Render a fixed set of toy-world prompts, judge each MP4 from its pixels, and compare the frames with the
    model's reference renders. Exits 1 when adherence misses a target or the frames drift below 40 dB PSNR.
    With --images, each video starts from a picture: exits 1 when frame 0 falls below 25 dB of the picture after
    the VAE round trip, or colour, shape and direction are kept in under 90% of videos, or the background in 95%.
    With --images --unseen: exits 1 when frame 0 averages below 25 dB of the picture itself, or colour, direction
    or background are kept in under 95% of videos (or frame 0 falls below 25 dB of the VAE round trip)."""
    if unseen and not images:
        fail(UsageError("--unseen: unseen pictures are for --images"))
    if validation and not unseen:
        fail(UsageError("--validation: the validation set is one of unseen pictures; add --unseen"))
    # Here, not at the top: torch only for the command that renders.
    from jobs.quality.evaluate import run_quality
    from jobs.quality.images import run_image_quality

    model = model or ("toy-i2v" if images else "toy")
    options = {"unseen": ("validation" if validation else "held-out") if unseen else None} if images else {}
    run = run_image_quality if images else run_quality
    try:
        with Progress(TextColumn("rendering"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=out, transient=True, disable=json_) as bar:
            task = bar.add_task("quality", total=count)
            report = run(Settings.from_env(), model, steps=steps, guidance=guidance, count=count,
                         batch=batch, on_batch=lambda n: bar.advance(task, n), **options)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(report.to_dict()))
    elif images:
        print_image_quality(report)
    else:
        print_quality(report)
    if not report.passed:
        raise typer.Exit(1)


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


def print_image_quality(report: ImageQualityReport) -> None:
    s, first, targets = report.shape, report.first_frame, report.targets
    out.print(f"{report.model}: {report.count} videos from pictures ({report.pictures}), {s['width']}x{s['height']}, "
              f"{s['frames']} frames, {s['steps']} steps, guidance {s['guidance']:g}, judged after the MP4 round trip "
              f"({report.seconds:.0f} s)", highlight=False)

    def verdict(value: float, goal: float | None) -> str:
        return "" if goal is None else f" (>= {goal:g} required) " + ("ok" if value >= goal else "MISSED")

    out.print(f"frame 0 against the picture after the VAE round trip: PSNR min {first['psnr_db_min']:.1f} dB"
              f"{verdict(first['psnr_db_min'], targets.get('first_frame_psnr_db'))}, mean "
              f"{first['psnr_db_mean']:.1f}", highlight=False)
    out.print(f"against the picture itself: mean {first['vs_image_psnr_db_mean']:.1f} dB"
              f"{verdict(first['vs_image_psnr_db_mean'], targets.get('vs_image_psnr_db_mean'))}, min "
              f"{first['vs_image_psnr_db_min']:.1f}; H.264 alone (the picture held still, MP4 round trip): mean "
              f"{first['h264_psnr_db_mean']:.1f}, min {first['h264_psnr_db_min']:.1f}", highlight=False)
    table = Table("attribute", "adherence", "target", "")
    for name, value in report.adherence.items():
        goal = targets.get(name)
        table.add_row(name, f"{value:.1%}", "" if goal is None else f">= {goal:.0%}",
                      "" if goal is None else ("ok" if value >= goal else "MISSED"))
    out.print(table)
    out.print("PASSED" if report.passed else "FAILED", highlight=False)
