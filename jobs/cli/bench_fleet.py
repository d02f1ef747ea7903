"""`reelbatch bench fleet` and `bench scale`: the control plane measured (jobs.bench.fleet, jobs.bench.scale),
printed."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.progress import Progress, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from jobs.cli.bench_options import JsonOption, counts
from jobs.cli.console import err, fail, out, progress_text
from jobs.errors import ReelbatchError
from jobs.settings import Settings


def fleet(
    levels: Annotated[str, typer.Option("--levels", help="Simulated worker counts, comma-separated.")] = "10,20,40,80",
    factor: Annotated[float, typer.Option("--factor", min=0.001, max=1.0, help="Time compression; one simulated "
                                          "worker stands for 1/FACTOR GPUs.")] = 0.02,
    batch_s: Annotated[float, typer.Option("--batch-s", min=1.0, max=3600.0, help="A batch's seconds on a GPU (a "
                                           "shape's measured time).")] = 60.0,
    json_: JsonOption = False,
) -> None:
    """The control plane (REELBATCH_DATABASE_URL's PostgreSQL, REELBATCH_BROKER_URL's Redis) under simulated workers
    at each of --levels: cycles/s, claim P50/P99, database time per video, the GPUs it supports."""
    bench_fleet(counts("--levels", levels, 2000), factor, batch_s, json_)


def scale(
    videos: Annotated[int, typer.Option("--scale-videos", min=100, max=10_000_000,
                                        help="The submitted run's videos.")] = 100_000,
    finished: Annotated[int, typer.Option("--finished", min=0, max=100_000_000,
                                          help="Finished videos added to the tables.")] = 1_000_000,
    repeat: Annotated[int, typer.Option("--scale-repeat", min=1, max=20, help="Times each of status and the reports "
                                        "is run (the fastest is shown, every run with --json).")] = 2,
    json_: JsonOption = False,
) -> None:
    """submit, status and report of a large run, and the claim's latency with many finished videos in the tables,
    against REELBATCH_DATABASE_URL's PostgreSQL."""
    bench_scale(videos, finished, repeat, json_)


def bench_fleet(levels: tuple[int, ...], factor: float, batch_s: float, json_: bool) -> None:
    with Progress(progress_text(), TimeElapsedColumn(), console=err, transient=True,
                  disable=json_) as bar:
        task = bar.add_task("bench fleet")
        try:
            from jobs.bench.fleet import run_fleet  # here, not at the top: multiprocessing and kombu only here

            result = run_fleet(Settings.from_env(), levels=levels, factor=factor, batch_s=batch_s, on_level=lambda n: (
                bar.update(task, description=f"bench fleet: {n} simulated workers ({n / factor:,.0f} GPUs)")))
        except ReelbatchError as exc:
            fail(exc)
    if json_:
        out.print_json(json.dumps(result.to_dict()))
        return
    out.print(Text.assemble(("bench fleet", "bold"),
                            f": {result.batch_s:g} s batches of up to {result.max_batch}, time x{result.factor:g} "
                            f"(1 simulated worker = {1 / result.factor:g} GPUs), up to {result.processes} processes "
                            f"and {result.connections} PostgreSQL connections"), highlight=False)
    table = Table("GPUs", "cycles/s", "of offered", "claim P50 ms", "P99 ms", "whole: cycles/s", "P99 ms",
                  "DB CPU ms/video", "xact/video", "supports GPUs", "dup", "lost", "failed", "wasted", box=None)
    for lv in result.levels:
        db_cpu = "" if lv.db_cpu_ms_per_video is None else f"{lv.db_cpu_ms_per_video:.2f}"
        table.add_row(f"{lv.gpus:,.0f}", f"{lv.steady_cycles_per_s:.1f}", f"{lv.keeps_up:.0%}",
                      f"{lv.steady_claim_ms['p50']:.1f}", f"{lv.steady_claim_ms['p99']:.1f}", f"{lv.cycles_per_s:.1f}",
                      f"{lv.claim_ms['p99']:.1f}", db_cpu, f"{lv.transactions_per_video:.1f}",
                      f"{lv.supports_gpus:,.0f}", str(lv.duplicates), str(lv.lost), str(lv.failed),
                      str(lv.wasted_attempts))
    out.print(table)
    out.print("sustained: while every simulated worker was at work (the last one's first claim to the first one's "
              "last); whole: the level's span, first claim to last record", highlight=False)
    out.print(f"supported within the targets (claim P99 < 100 ms, kept up, nothing lost, failed or doubled): "
              f"{result.supported_gpus():,.0f} GPUs", highlight=False)


def bench_scale(videos: int, finished: int, repeat: int, json_: bool) -> None:
    with Progress(progress_text(), TimeElapsedColumn(), console=err, transient=True,
                  disable=json_) as bar:
        task = bar.add_task("bench scale")
        try:
            from jobs.bench.scale import run_scale  # here, not at the top: it starts subprocesses of the CLI

            r = run_scale(Settings.from_env(), videos=videos, finished=finished, repeat=repeat,
                          on_step=lambda what: bar.update(task, description=f"bench scale: {what}"))
        except ReelbatchError as exc:
            fail(exc)
    if json_:
        out.print_json(json.dumps(r.to_dict()))
        return
    a, b = r.claim_ms_pending_only, r.claim_ms_with_finished
    out.print(Text.assemble(("bench scale", "bold"),
                            f": a {r.videos:,}-video run; {r.finished:,} finished videos added"), highlight=False)
    out.print(f"submit {r.submit_s:.1f} s ({r.submit_cpu_s:.1f} s CPU), status {r.status_s:.2f} s "
              f"({r.status_cpu_s:.2f} s CPU; its queries {r.status_work_s:.2f} s), each a fresh process; "
              f"the fastest of {repeat}:", highlight=False)
    out.print(f"report --json {r.report_s:.2f} s ({r.report_cpu_s:.2f} s CPU; its work {r.report_sql_work_s:.2f} s), "
              f"text {r.report_text_s:.2f} s ({r.report_text_cpu_s:.2f} s CPU) made by PostgreSQL; in Python "
              f"(REELBATCH_REPORT_SQL=0) --json {r.report_python_s:.2f} s ({r.report_python_cpu_s:.2f} s CPU; its work "
              f"{r.report_work_s:.2f} s), text {r.report_text_python_s:.2f} s ({r.report_text_python_cpu_s:.2f} s CPU)",
              highlight=False)
    out.print(f"claim P50/P99 {a['p50']:.1f}/{a['p99']:.1f} ms with the run pending, {b['p50']:.1f}/{b['p99']:.1f} "
              f"ms with {r.finished:,} finished videos in the tables", highlight=False)
    out.print("the claim probe's plan:\n  " + "\n  ".join(r.claim_plan), highlight=False, markup=False)
