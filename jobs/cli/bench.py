"""`reelbatch bench`, a command group: with no subcommand, baseline (the plain diffusers script) and reelbatch's worker
path side by side, in one process; `bench quality`, `precision`, `fleet`, `scale`, `long`, `ladder`, `cold`,
`envelope` and `parallel` are its other modes, one function each (jobs.cli.bench_quality, bench_fleet, bench_load,
bench_devices; `precision` here, over jobs.cli.bench_precision).

jobs.cli.app registers it with `app.add_typer(bench_app, name="bench")`.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from jobs.cli.bench_devices import cold, envelope, parallel
from jobs.cli.bench_fleet import fleet, scale
from jobs.cli.bench_load import ladder, long
from jobs.cli.bench_options import BenchGroup, JsonOption, PresetOption, StepsOption, chosen_preset
from jobs.cli.bench_precision import bench_precision
from jobs.cli.bench_quality import quality
from jobs.cli.console import err, fail, literal, out, progress_text
from jobs.cost import profiles
from jobs.errors import ReelbatchError, UsageError
from jobs.reports.summary import STAGES
from jobs.settings import Settings

if TYPE_CHECKING:
    from jobs.bench.compare import BenchResult

bench_app = typer.Typer(cls=BenchGroup, short_help="Measure reelbatch: side by side with the diffusers script (no "
                        "subcommand), or quality, precision, long, ladder, fleet, scale, cold, envelope, parallel.")


@bench_app.callback(invoke_without_command=True)
def side_by_side(
    ctx: typer.Context,
    preset: PresetOption = "cpu",
    videos: Annotated[Optional[int], typer.Option("--videos", min=1, max=1000,
                                                  help="Videos per side (default: the preset's).")] = None,
    steps: StepsOption = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="reelbatch's side renders this registration at its defaults, the baseline its teacher at "
                        "the teacher's (e.g. --preset small --model toy-fast).")] = None,
    speed_only: Annotated[bool, typer.Option(
        "--speed-only", help="With --model: time a distilled registration even though its gate against its teacher "
                             "has not passed (workers refuse it); the output says so.")] = False,
    encoder_preset: Annotated[Optional[str], typer.Option(
        "--encoder-preset", help="x264's preset for both sides' MP4s (default: the preset's, medium).")] = None,
    profile_as: Annotated[Optional[str], typer.Option(
        "--profile-as", help="Record the side by side's profile for estimates under this registered model name "
                             "(default: the preset's model), e.g. real weights of the preset's architecture.")] = None,
    json_: JsonOption = False,
) -> None:
    """Measure reelbatch. With no subcommand: render the same videos with the script a user would write from the
    diffusers docs and with reelbatch's worker path, and print throughput, stage seconds, FLOPs, MFU and how far the
    outputs differ (and record the worker path's profile for `reelbatch estimate`). The subcommands are the other
    measurements, each with its own options."""
    if ctx.invoked_subcommand is not None:
        # These options are the side by side's: before a subcommand they would be ignored, so they are refused.
        # (Typer carries its own copy of click, so the source is read by its name.)
        given = [name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"]
        if given:
            names = ", ".join(f"--{name.rstrip('_').replace('_', '-')}" for name in given)
            fail(UsageError(f"{names}: an option of the side-by-side bench, given before `{ctx.invoked_subcommand}`; "
                            f"a subcommand's options follow its name (`reelbatch bench {ctx.invoked_subcommand} "
                            f"--help`)"))
        return
    chosen = chosen_preset(preset, steps, encoder_preset)
    if speed_only and model is None:
        fail(UsageError("--speed-only: only with --model (a distilled registration)"))
    total = 2 * (videos or chosen.videos)
    columns = (progress_text(), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=json_) as bar:
        task = bar.add_task(f"bench {preset}: baseline, then reelbatch", total=total)
        try:
            from jobs.bench.compare import run_bench  # here, not at the top: torch only for the command that renders

            settings = Settings.from_env()
            result = run_bench(chosen, settings, videos=videos, model=model, speed_only=speed_only,
                               on_video=lambda: bar.advance(task))
        except ReelbatchError as exc:
            fail(exc)
    profile = _record_profile(settings, chosen, result, profile_as)
    if json_:
        out.print_json(json.dumps({**result.to_dict(), "profile": profiles.as_entry(profile)}))
    else:
        print_bench(result)


@bench_app.command("precision", short_help="Precisions side by side: speed, weight bytes, peak memory, PSNR.")
def precision(
    modes: Annotated[list[str], typer.Argument(
        metavar="MODE", help="auto, fp32, bf16, fp16, int8-weight, int8, fp8 (engine.levers.precision).")],
    preset: PresetOption = "cpu",
    videos: Annotated[Optional[int], typer.Option("--videos", min=1, max=1000,
                                                  help="Videos per side (default: the preset's).")] = None,
    steps: StepsOption = None,
    text_encoder: Annotated[Optional[str], typer.Option(
        "--text-encoder", metavar="MODE",
        help="The text encoder's own mode on each MODE side (as a registration's text_encoder_precision:); exact "
             "and native keep it native.")] = None,
    json_: JsonOption = False,
) -> None:
    """Each precision MODE side by side with exact mode and the native engine on the preset's model: speed,
    transformer and text-encoder weight bytes, peak memory, PSNR to exact. (A mode's quality gate: `bench quality
    --precision`, and `--setting text_encoder_precision=MODE` for the text encoder's.)"""
    bench_precision(chosen_preset(preset, steps), modes, videos, json_, text_encoder)


bench_app.command("cold", short_help="A new worker's start: compile off, compile on cold, and from a bundle.")(cold)
bench_app.command("envelope", short_help="A model's peak memory per shape and batch: fitted, checked, kept.")(envelope)
bench_app.command("parallel", short_help="One video on one rank against several (Ulysses, CFG parallel).")(parallel)
bench_app.command("quality", short_help="Quality gates of lossy settings, precisions or a distilled model.")(quality)
bench_app.command("long", short_help="Long videos: chunked and full length, 1x and 4x the window.")(long)
bench_app.command("ladder", short_help="The worker path under load: each batch size x worker count.")(ladder)
bench_app.command("fleet", short_help="The control plane under simulated workers: the GPUs it supports.")(fleet)
bench_app.command("scale", short_help="submit, status, report and the claim with large tables.")(scale)


def _record_profile(settings: Settings, preset, result: BenchResult, name: str | None) -> profiles.Profile:
    """The worker path's seconds per video at the preset's size and its side's steps and guidance (a `--model`'s
    own), kept for `reelbatch estimate` (jobs.cost.profiles) under `name`, default the model that side rendered."""
    e = result.engine
    model = name or e.model["name"]
    profile = profiles.Profile(
        model=model, width=preset.width, height=preset.height, frames=preset.frames, steps=e.model["steps"],
        guidance=e.model["guidance"], seconds_per_video=e.wall_s / e.videos, videos=e.videos, batch=preset.batch,
        device=result.device, measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source=f"reelbatch bench --preset {result.preset} ({e.videos} videos, {e.model['steps']} steps)")
    try:
        path = profiles.record(settings.engine.cache_dir, profile)
    except (OSError, ReelbatchError) as exc:
        err.print(f"could not record the profile of {model}: {exc}", markup=False, highlight=False)
    else:
        err.print(f"recorded the profile of {model} for estimates in {path}", markup=False, highlight=False)
    return profile


def print_bench(r: BenchResult) -> None:
    b, e = r.baseline, r.engine
    out.print(Text(f"bench {r.preset}", style="bold"), f"on {r.device} ({r.dtype}, {r.environment.get('device_name')}, "
              f"commit {r.environment.get('commit')}): {r.shape['videos']} videos of {r.shape['width']}x"
              f"{r.shape['height']}, {r.shape['frames']} frames"
              + ("" if r.shape.get("guidance_2") is None else f", low-noise expert guidance {r.shape['guidance_2']:g}"))
    for name, side in (("baseline", b), ("reelbatch", e)):
        m = side.model
        extras = [f"adapters {', '.join(a['path'].rsplit('/', 1)[-1] for a in m['adapters'])}" if m["adapters"] else "",
                  f"sampler {m['sampler']}" if m["sampler"] else "", "light decoder" if m["decoder"] else ""]
        out.print(literal(f"  {name}: {m['name']}, {m['steps']} steps, guidance {m['guidance']:g}"
                          + "".join(f", {x}" for x in extras if x)))
    table = Table("", "baseline", "reelbatch", "ratio")
    table.add_row("videos/hour", f"{b.videos_per_hour:.1f}", f"{e.videos_per_hour:.1f}", f"{r.speedup:.2f}x")
    table.add_row("wall s", f"{b.wall_s:.2f}", f"{e.wall_s:.2f}", _ratio(b.wall_s, e.wall_s))
    for stage in (*STAGES, "checks", "other"):
        x, y = b.stages.get(stage, 0.0), e.stages.get(stage, 0.0)
        table.add_row(f"  {stage} s", f"{x:.2f}", f"{y:.2f}", _ratio(x, y))
    table.add_row("wall / compute", f"{b.wall_s / b.compute_s:.3f}", f"{e.wall_s / e.compute_s:.3f}", "")
    table.add_row("denoise MFU", f"{r.baseline_denoise_mfu:.2f}", f"{r.denoise_mfu:.2f}", "")
    sheet = r.datasheet_mfu()
    if sheet["engine"] is not None:
        table.add_row("  of datasheet peak", f"{sheet['baseline']:.2f}", f"{sheet['engine']:.2f}", "")
    out.print(table)
    out.print(f"denoise {r.baseline_gflop:.1f} GFLOP per video (baseline), {r.denoise_gflop:.1f} (reelbatch); matmul "
              f"peak {r.peak_gflops:.1f} GFLOP/s, so at least {r.denoise_floor_s:.2f} s of reelbatch's denoising per "
              f"video", highlight=False)
    if r.engine_gate:
        out.print(Text.assemble(("speed only", "bold"),
                                f": workers refuse reelbatch's side as its files are now ({r.engine_gate})"),
                  highlight=False)
    if r.same_model:
        out.print(f"min PSNR reelbatch vs baseline {r.min_psnr_db:.1f} dB (100 = identical)", highlight=False)
    else:
        out.print(f"two models: PSNR reelbatch vs baseline (for information) {r.min_psnr_db:.1f} dB at worst; "
                  "their quality is the distilled gate's (bench quality --model)", highlight=False)


def _ratio(baseline: float, engine: float) -> str:
    return f"{baseline / engine:.2f}x" if engine > 0 else ""
