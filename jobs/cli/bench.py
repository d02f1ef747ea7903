"""`reelbatch bench`: baseline (the plain diffusers script) and reelbatch's worker path, side by side, in one process.

jobs.cli.app registers it with `app.command()(bench)`.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from jobs.bench.presets import PRESETS
from jobs.cli.bench_fleet import bench_fleet, bench_scale
from jobs.cli.bench_precision import bench_precision
from jobs.cli.bench_quality import bench_quality
from jobs.cli.console import err, fail, literal, out, progress_text
from jobs.cost import profiles
from jobs.errors import ReelbatchError, UsageError
from jobs.reports.summary import STAGES
from jobs.settings import Settings
from storage.codecs import PRESETS as ENCODER_PRESETS

if TYPE_CHECKING:
    from jobs.bench.compare import BenchResult


def bench(
    preset: Annotated[str, typer.Option("--preset", help=f"One of: {', '.join(PRESETS)}.")] = "cpu",
    videos: Annotated[Optional[int], typer.Option("--videos", min=1, max=1000,
                                                  help="Videos per side (default: the preset's).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, max=200,
                                                 help="Denoising steps (default: the preset's).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")] = False,
    quality: Annotated[bool, typer.Option(
        "--quality", help="Measure lossy accelerators against exact mode on a judgeable model and record their "
                          "quality gates (instead of the side-by-side bench).")] = False,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="reelbatch's side renders this registration at its defaults, the baseline its teacher at "
                        "the teacher's (e.g. --preset small --model toy-fast). With --quality: a model trained on the "
                        "toy world (default toy); a distilled one is judged against its teacher.")] = None,
    setting: Annotated[Optional[list[str]], typer.Option(
        "--setting", help="With --quality, repeatable: NAME=VALUE[,NAME=VALUE] of step_cache, guidance_fraction, "
                          "step_scale (default: a measured list).")] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=400, help="With --quality on a toy-world model: how "
                                       "many of the judged set (a gate releases a lever on 32 or more).")] = 80,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="With --quality: a manifest (YAML or JSONL) whose videos, at their own sizes, steps and "
                          "seeds, are the gate's sample (default: the toy set on toy-world models, else the "
                          "shipped prompts at the model's defaults).")] = None,
    precision: Annotated[Optional[list[str]], typer.Option(
        "--precision", help="Repeatable: auto, fp32, bf16, fp16, int8-weight, int8, fp8 (engine.precision). Side by "
                            "side with exact mode and the native engine: speed, transformer weight bytes, peak memory, "
                            "PSNR to exact. With --quality: measure and record the mode's gate (with each --setting "
                            "if given).")] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=64, help="With --quality: videos per batch.")] = 8,
    ladder: Annotated[bool, typer.Option(
        "--ladder", help="Load-test the worker path at each batch size and worker count of the preset: "
                         "throughput, claim-to-stored P50/P95/P99, peak memory, failure rate.")] = False,
    batches: Annotated[str, typer.Option("--batches", help="With --ladder: batch sizes.")] = "1,2,4,8,16",
    workers: Annotated[str, typer.Option("--workers", help="With --ladder: worker process counts.")] = "1,2",
    encoder_preset: Annotated[Optional[str], typer.Option(
        "--encoder-preset", help="x264's preset for both sides' MP4s (default: the preset's, medium).")] = None,
    speed_only: Annotated[bool, typer.Option(
        "--speed-only", help="With --model: time a distilled registration even though its gate against its teacher "
                             "has not passed (workers refuse it); the output says so.")] = False,
    long: Annotated[bool, typer.Option(
        "--long", help="One prompt at 1x and 4x the preset's clip length as the window: chunked (time and peak "
                       "memory ratios, seam score) and full length.")] = False,
    profile_as: Annotated[Optional[str], typer.Option(
        "--profile-as", help="Record the side by side's profile for estimates under this registered model name "
                             "(default: the preset's model), e.g. real weights of the preset's architecture.")] = None,
    fleet: Annotated[bool, typer.Option(
        "--fleet", help="The control plane (REELBATCH_DATABASE_URL's PostgreSQL, REELBATCH_BROKER_URL's Redis) under "
                        "simulated workers at each of --levels: cycles/s, claim P50/P99, database time per video, "
                        "the GPUs it supports.")] = False,
    levels: Annotated[str, typer.Option("--levels", help="With --fleet: simulated worker counts.")] = "10,20,40,80",
    factor: Annotated[float, typer.Option("--factor", min=0.001, max=1.0, help="With --fleet: time compression; "
                                          "one simulated worker stands for 1/FACTOR GPUs.")] = 0.02,
    batch_s: Annotated[float, typer.Option("--batch-s", min=1.0, max=3600.0, help="With --fleet: a batch's "
                                           "seconds on a GPU (a shape's measured time).")] = 60.0,
    scale: Annotated[bool, typer.Option(
        "--scale", help="submit, status and report of a large run, and the claim's latency with many finished "
                        "videos in the tables, against REELBATCH_DATABASE_URL's PostgreSQL.")] = False,
    scale_videos: Annotated[int, typer.Option("--scale-videos", min=100, max=10_000_000,
                                              help="With --scale: the submitted run's videos.")] = 100_000,
    finished: Annotated[int, typer.Option("--finished", min=0, max=100_000_000,
                                          help="With --scale: finished videos added to the tables.")] = 1_000_000,
    scale_repeat: Annotated[int, typer.Option("--scale-repeat", min=1, max=20,
                                              help="With --scale: times each of status and the reports is run "
                                                   "(the fastest is shown, every run with --json).")] = 2,
) -> None:
    """Render the same videos with the script a user would write from the diffusers docs and with reelbatch's
    worker path, and print throughput, stage seconds, FLOPs, MFU and how far the outputs differ.

    With --quality: render a fixed sample set in exact mode and with each lossy setting, judge both, and record
    which settings pass their gate (mean PSNR >= 25 dB, every video's SSIM >= 0.5, on the toy world adherence
    within 2 points); workers use only those, and only from 32 videos up. With --quality --model of a distilled
    registration: render it and its teacher on the same sample, judge both and record its distilled gate (flicker,
    motion, blank frames, frozen videos; adherence on the toy world, a CLIP score where registered)."""
    if quality:
        bench_quality(model or "toy", setting, count, batch, json_, prompts, precision or [])
        return
    if fleet:
        bench_fleet(_counts("--levels", levels, 2000), factor, batch_s, json_)
        return
    if scale:
        bench_scale(scale_videos, finished, scale_repeat, json_)
        return
    if preset not in PRESETS:
        err.print(f"--preset: {preset!r} is not a preset (choose from {', '.join(PRESETS)})")
        raise typer.Exit(2)
    chosen = PRESETS[preset] if steps is None else dataclasses.replace(PRESETS[preset], steps=steps)
    if encoder_preset is not None:
        if encoder_preset not in ENCODER_PRESETS:
            fail(UsageError(f"--encoder-preset: {encoder_preset!r} is not one of {', '.join(ENCODER_PRESETS)}"))
        chosen = dataclasses.replace(chosen, encoder_preset=encoder_preset)
    if speed_only and model is None:
        fail(UsageError("--speed-only: only with --model (a distilled registration)"))
    if model is not None and (long or ladder):
        fail(UsageError("--model: only the side-by-side bench and --quality take a model"))
    if precision:
        if model is not None or long or ladder:
            fail(UsageError("--precision: the side-by-side bench of the preset's model, or with --quality"))
        bench_precision(chosen, precision, videos, json_)
        return
    if long:
        _bench_long(chosen, json_)
        return
    if ladder:
        _bench_ladder(chosen, _counts("--batches", batches, 256), _counts("--workers", workers, 64), json_)
        return
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
        out.print_json(json.dumps({**result.to_dict(), "profile": dataclasses.asdict(profile)}))
    else:
        print_bench(result)


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
        path = profiles.record(settings.cache_dir, profile)
    except (OSError, ReelbatchError) as exc:
        err.print(f"could not record the profile of {model}: {exc}", markup=False, highlight=False)
    else:
        err.print(f"recorded the profile of {model} for estimates in {path}", markup=False, highlight=False)
    return profile


def _bench_long(preset, json_: bool) -> None:
    with Progress(progress_text(), TimeElapsedColumn(), console=err, transient=True,
                  disable=json_) as bar:
        bar.add_task(f"bench --long {preset.name}: 1x and 4x, chunked and full length")
        try:
            from jobs.bench.long import run_long  # here, not at the top: torch only for the command that renders

            r = run_long(preset, Settings.from_env())
        except ReelbatchError as exc:
            fail(exc)
    if json_:
        out.print_json(json.dumps(r))
        return
    one, many = r["frames"]["1x"], r["frames"]["4x"]
    out.print(Text(f"bench --long {r['preset']}", style="bold"),
              f"on {r['device']}: window {r['window_frames']} frames; "
              f"{one} frames = {r['chunks']['1x']} chunk, {many} frames = {r['chunks']['4x']} chunks", highlight=False)
    full = r["full_length"]
    full_text = (f"full length: time x{full['time_ratio']:.2f}, peak memory x{full['peak_memory_ratio']:.2f}"
                 if "error" not in full else f"full length did not run: {full['error']}")
    out.print(f"chunked: time x{r['time_ratio']:.2f} for x{r['chunk_ratio']:.0f} chunks "
              f"({r['time_ratio_over_chunk_ratio']:.2f} of linear), peak memory x{r['peak_memory_ratio']:.2f}, "
              f"seam score {r['seam_score']:.2f}; {full_text}", highlight=False)


def _counts(option: str, raw: str, most: int) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or not all(1 <= v <= most for v in values):
        fail(UsageError(f"{option}: expected comma-separated whole numbers from 1 to {most}, got {raw!r}"))
    return values


def _bench_ladder(preset, batches: tuple[int, ...], workers: tuple[int, ...], json_: bool) -> None:
    with Progress(progress_text(), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=json_) as bar:
        task = bar.add_task("ladder", total=len(batches) * len(workers))

        started = []

        def on_level(w: int, b: int) -> None:  # called as each level starts: the ones before it are done
            bar.update(task, description=f"ladder {preset.name}: {w} worker(s) x batch {b}", completed=len(started))
            started.append((w, b))

        try:
            from jobs.bench.ladder import run_ladder  # here, not at the top: torch only when rendering

            result = run_ladder(preset, Settings.from_env(), batches=batches, workers=workers, on_level=on_level)
        except ReelbatchError as exc:
            fail(exc)
    if json_:
        out.print_json(json.dumps(result.to_dict()))
        return
    s = result.shape
    out.print(Text(f"bench --ladder {result.preset}", style="bold"), f"on {result.device}: {s['width']}x{s['height']}, "
              f"{s['frames']} frames, {s['steps']} steps; claim to stored object, per video", highlight=False)
    table = Table("workers", "batch", "videos", "vid/h", "P50 s", "P95 s", "P99 s", "peak RSS MB", "device MB",
                  "failed", box=None)
    for lv in result.levels:
        table.add_row(str(lv.workers), str(lv.batch), str(lv.videos), f"{lv.videos_per_hour:.0f}",
                      f"{lv.latency_s['p50']:.2f}", f"{lv.latency_s['p95']:.2f}", f"{lv.latency_s['p99']:.2f}",
                      f"{lv.peak_rss_mb:.0f}", "" if lv.peak_device_mb is None else f"{lv.peak_device_mb:.0f}",
                      f"{lv.failure_rate:.1%}")
    out.print(table)
    best = result.steady()
    out.print(f"steady state: {best.videos_per_hour:.0f} videos/hour at {best.workers} worker(s) x batch "
              f"{best.batch}", highlight=False)


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
                  "their quality is the distilled gate's (bench --quality --model)", highlight=False)


def _ratio(baseline: float, engine: float) -> str:
    return f"{baseline / engine:.2f}x" if engine > 0 else ""
