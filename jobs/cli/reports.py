"""`reelbatch report`, `capacity` and `ledger`: what a run did and cost, what a fleet could do, and where every
worker second went (jobs.usecases.reports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from jobs.cli.console import emit_json, emit_json_listing, err, fail, literal, note_database, out
from jobs.errors import ReelbatchError
from jobs.reports.text import TEXT_ROWS, print_report
from jobs.settings import Settings
from jobs.usecases import reports

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def report(run: Annotated[str, typer.Argument(help="Run name or id.")], json_: JsonOpt = False,
           results: Annotated[bool, typer.Option(
               "--results", help="Also write results.jsonl and errors.jsonl next to the run's videos.")] = False,
           html_file: Annotated[Optional[Path], typer.Option(
               "--html", help="Also write a self-contained HTML report (contact sheet, charts) to this file.")] = None,
           ) -> None:
    """Counts, failures by reason, throughput, queue wait and render latency percentiles, stage seconds, cost per
    successful video and per video-second, gross margin, and per-video outputs, checksums and cost."""
    try:
        settings = Settings.from_env()
        note_database(settings)
        if results:
            for uri in reports.write_result_files(settings, run):
                err.print(f"wrote {uri}", highlight=False)  # a console that shows it as it is (console.py)
        # On PostgreSQL the server counts and writes the report (jobs.reports.postgres); the HTML report draws from
        # every row, so it reads them all, as on SQLite.
        if html_file is not None:
            data = reports.write_html(settings, run, html_file, lambda text: err.print(text, markup=False,
                                                                                       highlight=False))
            err.print(f"wrote {html_file}", highlight=False)
        elif reports.in_sql(settings):
            found = reports.report_in_sql(settings, run, with_entries=json_, listed=TEXT_ROWS)
            if json_:
                emit_json_listing(found.data, found.entries)
            else:
                print_report(out, found.data)
            return
        else:
            # The text report lists the first TEXT_ROWS videos: only those (and any with an error) need an entry.
            data = reports.report(settings, run, listed=None if json_ else TEXT_ROWS)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        emit_json(data)
    else:
        print_report(out, data)


def capacity(
    run: Annotated[str, typer.Option("--run", help="A finished run (name or id) to plan from.")],
    gpus: Annotated[int, typer.Option("--gpus", min=1, max=100000, help="GPUs to plan for.")] = 1,
    run_gpus: Annotated[int, typer.Option("--run-gpus", min=1, max=100000,
                                          help="GPUs (workers) that rendered the run.")] = 1,
    headroom: Annotated[float, typer.Option("--headroom", min=0, max=0.9, help="Budget headroom.")] = 0.2,
    json_: JsonOpt = False,
) -> None:
    """Videos per day and month, cost per video and margin for N GPUs at three levels (theoretical ceiling,
    sustainable, budget), from what RUN measured, with every assumption printed."""
    try:
        result = reports.capacity(Settings.from_env(), run, gpus, run_gpus, headroom)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(result))
        return
    out.print(Text.assemble(("capacity", "bold"), literal(f" of {gpus} GPU(s), from run {result['run']}")))
    table = Table("level", "videos/hour", "videos/day", "videos/month", "cost/video $", "margin", box=None)
    for lv in result["levels"]:
        table.add_row(lv["name"], f"{lv['videos_per_hour']:.1f}", f"{lv['videos_per_day']:.0f}",
                      f"{lv['videos_per_month']:.0f}", f"{lv['cost_per_video_usd']:.6f}", f"{lv['gross_margin']:.1%}")
    out.print(table)
    a = result["assumptions"]
    out.print(f"assumptions: {a['gpu_seconds_per_successful_video']:.2f} GPU-s per successful video; utilisation "
              f"measured {a['measured_utilisation']:.0%} ({a['utilisation_source']}) on {a['run_gpus']} GPU(s), "
              f"used "
              f"{a['utilisation_used']:.0%} (capped at {a['utilisation_cap']:.0%}); retry rate {a['retry_rate']:.1%}; "
              f"headroom {a['headroom']:.0%}; ${a['gpu_hour_usd']:g}/GPU-hour ({a['gpu_hour_source']}); "
              f"${a['price_per_video_second_usd']:g}/video-second ({a['price_source']}), mean video "
              f"{a['mean_video_length_s']:.2f} s; {a['days_per_month']} days a month. {a['note']}.", highlight=False)


def ledger_cmd(json_: JsonOpt = False) -> None:
    """Every worker session's up time at its rate, split into what was charged to videos and what was idle.

    Charged plus idle equals up time x rate for each session, to rounding; `report RUN` spreads idle time over the
    successful videos of the runs each session served."""
    try:
        data = reports.ledger(Settings.from_env())
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(data))
        return
    table = Table("session", "worker", "state", "up s", "charged s", "idle s", "up $", "charged $", "idle $",
                  "rate", box=None, pad_edge=False)
    for r in data["sessions"]:
        table.add_row(str(r["id"]), r["owner"], r["state"], f"{r['up_s']:.1f}", f"{r['charged_s']:.1f}",
                      f"{r['idle_s']:.1f}", f"{r['total_micro_usd'] / 1e6:.6f}", f"{r['charged_micro_usd'] / 1e6:.6f}",
                      f"{r['idle_micro_usd'] / 1e6:.6f}", f"${r['rate_usd_per_hour']:g}/h ({r['rate_source']})")
    out.print(table)
    out.print(f"{len(data['sessions'])} worker sessions: ${data['total_usd']:.6f} up = ${data['charged_usd']:.6f} charged to "
              f"videos + ${data['idle_usd']:.6f} idle", highlight=False)
