"""`reelbatch bench long` and `bench ladder`: the worker path under longer videos and under load (jobs.bench.long,
jobs.bench.ladder), printed as tables or JSON."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from jobs.cli.bench_options import JsonOption, PresetOption, StepsOption, chosen_preset, counts
from jobs.cli.console import err, fail, out, progress_text
from jobs.errors import ReelbatchError
from jobs.settings import Settings


def long(preset: PresetOption = "cpu", steps: StepsOption = None, json_: JsonOption = False) -> None:
    """One prompt at 1x and 4x the preset's clip length as the window: chunked (time and peak memory ratios, seam
    score) and full length."""
    chosen = chosen_preset(preset, steps)
    with Progress(progress_text(), TimeElapsedColumn(), console=err, transient=True,
                  disable=json_) as bar:
        bar.add_task(f"bench long {chosen.name}: 1x and 4x, chunked and full length")
        try:
            from jobs.bench.long import run_long  # here, not at the top: torch only for the command that renders

            r = run_long(chosen, Settings.from_env())
        except ReelbatchError as exc:
            fail(exc)
    if json_:
        out.print_json(json.dumps(r))
        return
    one, many = r["frames"]["1x"], r["frames"]["4x"]
    out.print(Text(f"bench long {r['preset']}", style="bold"),
              f"on {r['device']}: window {r['window_frames']} frames; "
              f"{one} frames = {r['chunks']['1x']} chunk, {many} frames = {r['chunks']['4x']} chunks", highlight=False)
    full = r["full_length"]
    full_text = (f"full length: time x{full['time_ratio']:.2f}, peak memory x{full['peak_memory_ratio']:.2f}"
                 if "error" not in full else f"full length did not run: {full['error']}")
    out.print(f"chunked: time x{r['time_ratio']:.2f} for x{r['chunk_ratio']:.0f} chunks "
              f"({r['time_ratio_over_chunk_ratio']:.2f} of linear), peak memory x{r['peak_memory_ratio']:.2f}, "
              f"seam score {r['seam_score']:.2f}; {full_text}", highlight=False)


def ladder(
    preset: PresetOption = "cpu",
    steps: StepsOption = None,
    batches: Annotated[str, typer.Option("--batches", help="Batch sizes, comma-separated.")] = "1,2,4,8,16",
    workers: Annotated[str, typer.Option("--workers", help="Worker process counts, comma-separated.")] = "1,2",
    json_: JsonOption = False,
) -> None:
    """Load-test the worker path at each batch size and worker count of the preset: throughput, claim-to-stored
    P50/P95/P99, peak memory, failure rate."""
    batch_sizes, worker_counts = counts("--batches", batches, 256), counts("--workers", workers, 64)
    chosen = chosen_preset(preset, steps)
    with Progress(progress_text(), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=json_) as bar:
        task = bar.add_task("ladder", total=len(batch_sizes) * len(worker_counts))

        started = []

        def on_level(w: int, b: int) -> None:  # called as each level starts: the ones before it are done
            bar.update(task, description=f"ladder {chosen.name}: {w} worker(s) x batch {b}", completed=len(started))
            started.append((w, b))

        try:
            from jobs.bench.ladder import run_ladder  # here, not at the top: torch only when rendering

            result = run_ladder(chosen, Settings.from_env(), batches=batch_sizes, workers=worker_counts,
                                on_level=on_level)
        except ReelbatchError as exc:
            fail(exc)
    if json_:
        out.print_json(json.dumps(result.to_dict()))
        return
    s = result.shape
    out.print(Text(f"bench ladder {result.preset}", style="bold"), f"on {result.device}: {s['width']}x{s['height']}, "
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
