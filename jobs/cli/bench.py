"""`reelbatch bench`, a command group: with no subcommand, baseline (the plain diffusers script) and reelbatch's worker
path side by side, in one process; `bench quality`, `precision`, `fleet`, `scale`, `long` and `ladder` are its other
modes, one function each (jobs.cli.bench_quality, bench_fleet, bench_load; `precision` here, over
jobs.cli.bench_precision).

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


@bench_app.command("cold", short_help="A new worker's start: compile off, compile on cold, and from a bundle.")
def cold(
    model: Annotated[str, typer.Option("--model", help="A registered model.")] = "tiny",
    resolution: Annotated[str, typer.Option("--resolution", help="WIDTHxHEIGHT of its one video.")] = "64x64",
    steps: Annotated[int, typer.Option("--steps", min=1, max=200, help="Denoising steps.")] = 2,
    json_: JsonOption = False,
) -> None:
    """Three fresh `reelbatch run`s of one video, each a new machine (its own folders and Inductor cache): compile
    off, compile on with an empty warm-start store, and compile on from the bundle the second stored; seconds from
    process start to the video stored, and the ratio."""
    from jobs.bench.cold import run_cold

    try:
        r = run_cold(model, resolution, steps, on_side=lambda name: err.print(f"bench cold: {name}"))
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"model": r.model, "sides": [vars(s) for s in r.sides], "speedup": r.speedup,
                                   "identical": r.identical}))
        return
    table = Table(title=f"bench cold: {r.model} {resolution}, {steps} steps, one video")
    for column in ("side", "process start -> video stored", "bundles stored", "MP4 sha256"):
        table.add_column(column)
    for s in r.sides:
        table.add_row(s.name, f"{s.seconds:.1f} s", str(s.bundles), s.sha256[:12])
    out.print(table)
    out.print(f"from the bundle: {r.speedup:.2f}x sooner than cold with compile on; "
              f"MP4s {'identical' if r.identical else 'DIFFERENT'}")


@bench_app.command("envelope", short_help="A model's peak memory per shape and batch: fitted, checked, kept.")
def envelope(
    model: Annotated[Optional[str], typer.Option("--model", help="A registered model.")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="Or a bench preset's model (e.g. cpu).")] = None,
    resolution: Annotated[Optional[str], typer.Option(
        "--resolution", help="WIDTHxHEIGHT the sizes are planned around (default: the model's).")] = None,
    frames: Annotated[Optional[int], typer.Option("--frames", min=1, max=1001,
                                                  help="Frames a pass (default: the model's).")] = None,
    record: Annotated[bool, typer.Option("--record/--no-record",
                                         help="Keep it in the database for workers and submit.")] = True,
    json_: JsonOption = False,
) -> None:
    """Measure peak memory on this device at sizes around the model's shape (batch 1 and 2, wider, longer), fit the
    line (a fixed part, per latent token, per frame pixel), check it on three sizes the fit never saw, and keep the
    envelope: workers then take at most the batch of each shape that leaves 20% of memory free, and submit refuses a
    video that fits no device measured."""
    from jobs.bench.envelope import model_info, run_envelope

    settings = Settings.from_env()
    try:
        width = height = None
        if resolution is not None:
            width, height = _resolution(resolution)
        info = model_info(settings, model, preset)
        err.print(f"bench envelope: measuring {info.name} (a child process; the first size loads the model)")
        r = run_envelope(settings, info, width, height, frames, record)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(r.to_dict()))
        return
    e = r.envelope
    out.print(f"{e.model} on {e.device}: {e.resident_bytes / 2**20:.0f} MiB resident; a batch's peak = "
              f"{e.fixed_bytes / 2**20:.1f} MiB + {e.per_token_bytes / 2**10:.2f} KiB a latent token + "
              f"{e.per_pixel_bytes / 2**10:.2f} KiB a frame pixel; budget {e.budget_bytes / 2**30:.2f} GiB "
              f"({1 - e.spare:.0%} of {e.memory_bytes / 2**30:.1f} GiB less resident)")
    table = Table(title="measured peaks (MiB)")
    for column in ("size", "tokens", "measured", "predicted", "error", "used for"):
        table.add_column(column)
    for p in r.fitted:
        table.add_row(_size(p), f"{p.batch * p.tokens:,}", f"{p.peak_bytes / 2**20:.1f}",
                      f"{e.predict(p.batch, p.tokens, p.width, p.height) / 2**20:.1f}", "", "fit")
    for h in r.held:
        p = h.point
        table.add_row(_size(p), f"{p.batch * p.tokens:,}", f"{p.peak_bytes / 2**20:.1f}",
                      f"{h.predicted / 2**20:.1f}", f"{h.error:+.1%}", "held out")
    out.print(table)
    for failed in r.failed:
        out.print(f"did not fit: {failed}")
    out.print(f"held out: worst error {r.worst:.1%} over {len(r.held)} sizes; largest batch: " + ", ".join(
        f"{p.width}x{p.height} {p.frames} frames: {n}" for p, n in r.largest()))
    out.print("kept in the database for workers and submit" if r.recorded else "not kept (--no-record)")


def _size(p) -> str:
    return f"{p.batch} x {p.width}x{p.height}, {p.frames} frames"


def _resolution(text: str) -> tuple[int, int]:
    try:
        width, height = (int(n) for n in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--resolution: expected WIDTHxHEIGHT, e.g. 128x128, got {text!r}") from None
    if width < 1 or height < 1:
        raise UsageError(f"--resolution: sides must be at least 1, got {text!r}")
    return width, height


@bench_app.command("parallel", short_help="One video on one rank against several (Ulysses, CFG parallel).")
def parallel(
    preset: PresetOption = "small",
    ranks: Annotated[str, typer.Option(
        "--ranks", help="Comma-separated layouts, each a side: U (Ulysses on U ranks) or UxC (C 2: CFG parallel "
                        "too, U x C ranks), e.g. 2,1x2,2x2.")] = "2",
    videos: Annotated[int, typer.Option("--videos", min=1, max=100, help="Videos a side, one at a time.")] = 4,
    steps: StepsOption = None,
    json_: JsonOption = False,
) -> None:
    """The preset's model rendering the same videos on one rank and on each layout of --ranks (engine.parallel;
    gloo on a CPU, nccl on GPUs): seconds a video, peak memory per rank, speedup, efficiency, and whether every
    side's frames are the bytes of one rank (with a CFG-parallel side, every side runs the two passes as two calls)."""
    from engine.models.envelope import tokens
    from engine.models.shape_rules import rules_of
    from engine.parallel import Layout, problem
    from jobs.bench.parallel import run_parallel
    from jobs.bench.sides import bench_model

    settings = Settings.from_env()
    try:
        layouts = [_layout(text) for text in ranks.split(",")]
    except ValueError:
        fail(UsageError(f"--ranks: comma-separated layouts, U or UxC with U of 1 or more, C of 1 or 2 and at least 2 "
                        f"ranks each, got {ranks!r}"))
    try:
        chosen = chosen_preset(preset, steps)
        info = bench_model(chosen, settings.engine.cache_dir)
        heads = json.loads((info.path / "transformer" / "config.json").read_text())["num_attention_heads"]
        each = tokens(rules_of(info), chosen.width, chosen.height, chosen.frames)
        for (u, c), text in zip(layouts, ranks.split(","), strict=True):
            why = problem(Layout(u, c), heads, each)
            if why is not None:
                raise UsageError(f"--ranks {text}: {why} ({info.name} at {chosen.width}x{chosen.height}, "
                                 f"{chosen.frames} frames)")
        err.print(f"bench parallel: {info.name}, 1 rank then {ranks} (each side loads the model)")
        r = run_parallel(settings, info, chosen, layouts, videos)
    except ReelbatchError as exc:
        fail(exc)
    data = r.to_dict()
    if json_:
        out.print_json(json.dumps(data))
        return
    table = Table(title=f"bench parallel: {r.model} {r.shape}, {r.videos} videos a side, one at a time"
                        + ("" if r.batched_guidance else "; guidance's two passes as two calls on every side"))
    for column in ("ulysses x cfg", "s a video", "speedup", "efficiency", "peak RSS MB a rank", "same bytes"):
        table.add_column(column)
    for s in data["sides"]:
        table.add_row(f"{s['ulysses']} x {s['cfg']}", f"{s['seconds_per_video']:.2f}", f"{s['speedup']:.2f}x",
                      f"{s['efficiency']:.2f}", ", ".join(f"{m:.0f}" for m in s["peak_rss_mb"]),
                      "yes" if s["identical"] else "NO")
    out.print(table)


def _layout(text: str) -> tuple[int, int]:
    u, _, c = text.strip().partition("x")
    layout = (int(u), int(c or 1))
    if layout[0] < 1 or layout[1] not in (1, 2) or layout[0] * layout[1] < 2:
        raise ValueError(text)
    return layout


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
