"""`reelbatch report`, `capacity` and `ledger`: what a run did and cost, what a fleet could do, and where every
worker second went."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from jobs.cli.console import emit_json, emit_json_listing, err, fail, literal, out
from jobs.cost import ledger
from jobs.db import queries
from jobs.db.connect import is_postgres, session_factory
from jobs.errors import ReelbatchError, UsageError
from jobs.manifest.keys import object_key, poster_key
from jobs.reports import postgres
from jobs.reports.capacity import plan
from jobs.reports.html import html_report
from jobs.reports.results import write_results
from jobs.reports.summary import entry, report_dict, report_of
from jobs.reports.text import TEXT_ROWS, print_report
from jobs.settings import Settings
from storage.poster import poster_jpeg
from storage.stores import StoreError, open_store

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
        factory = session_factory(settings.database_url)
        # On PostgreSQL the server counts and writes the report (jobs.reports.postgres); the HTML report draws from
        # every row, so it reads them all, as on SQLite.
        in_sql = settings.reports.sql and html_file is None and is_postgres(settings.database_url)
        if in_sql:
            run_row, videos = queries.find_run(factory, run), None
        else:
            run_row, videos = queries.load_report(factory, run)
        if results:
            try:
                for uri in write_results(factory, run):
                    err.print(f"wrote {uri}", highlight=False)  # a console that shows it as it is (console.py)
            except StoreError as exc:
                raise ReelbatchError(f"writing the result files of run {run}: {exc}") from None
    except ReelbatchError as exc:
        fail(exc)
    if in_sql:
        _report_in_sql(factory, run_row, settings, json_)
        return
    costs = ledger.run_ledger(factory, run_row.id)
    # The text report lists the first TEXT_ROWS videos: only those (and any with an error) need an entry.
    data = report_dict(run_row, videos, settings.prices.sale, costs, listed=None if json_ or html_file else TEXT_ROWS)
    if html_file is not None:
        _write_html(html_file, data, run_row, videos, costs["usd_per_charged_s"])
    if json_:
        emit_json(data)
    else:
        print_report(out, data)


def report_data(settings: Settings, factory, run: str) -> dict:
    """`report --json`'s data, for the HTTP API (jobs.service): the report from every row, as on SQLite (the same
    JSON that PostgreSQL's counting in SQL writes)."""
    run_row, videos = queries.load_report(factory, run)
    return report_dict(run_row, videos, settings.prices.sale, ledger.run_ledger(factory, run_row.id))


def _report_in_sql(factory, run_row, settings: Settings, json_: bool) -> None:
    # One snapshot for the charges, the figures and the entries, so a run that workers are still recording adds up.
    # The entries are read to the end before printing: a reader that stops reading (`| less`) must not hold the
    # transaction open past the server's idle-in-transaction timeout (jobs.db.connect), which would end it mid-report.
    with factory() as s:
        s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        if json_ and settings.reports.parallel:  # the entries on a second connection meanwhile (jobs.reports.postgres)
            with postgres.entries_beside(factory, s, run_row) as later:
                data = _figures_in_sql(factory, s, run_row, settings, json_)
                # Done: end this transaction rather than leave it idle (and to the server's idle timeout) while the
                # entries come; the second connection took its snapshot already and keeps it.
                s.rollback()
                entries = later.result()
        else:
            data = _figures_in_sql(factory, s, run_row, settings, json_)
            entries = list(postgres.entries(s, run_row)) if json_ else []
    if json_:
        emit_json_listing(data, entries)
    else:
        print_report(out, data)


def _figures_in_sql(factory, s, run_row, settings: Settings, json_: bool) -> dict:
    """The report but `--json`'s entries, counted by PostgreSQL in `s`'s transaction."""
    charges = postgres.charges(s, run_row)
    figures = postgres.figures(s, run_row, sum(micro for _, micro, _ in charges.by_kind))
    costs = ledger.run_ledger(factory, run_row.id, charges)
    rows = [] if json_ else [entry(v, micro) for v, micro in postgres.listed_rows(s, run_row, TEXT_ROWS)]
    return report_of(run_row, figures, rows, settings.prices.sale, costs)


def _write_html(path: Path, data: dict, run_row, videos, usd_per_worker_s: float | None) -> None:
    store = open_store(run_row.output)

    def poster_of(video):
        try:
            if video.poster_uri:
                return store.get(poster_key(run_row.name, video.key))
            # A video stored before posters existed (or whose poster could not be stored): made from its MP4.
            return poster_jpeg(store.get(object_key(run_row.name, video.key)))
        except (StoreError, ValueError) as exc:
            err.print(f"{video.key}: not in the contact sheet: {exc}", markup=False, highlight=False)
            return None

    try:
        path.write_text(html_report(data, run_row, videos, poster_of, usd_per_worker_s), encoding="utf-8")
    except OSError as exc:
        fail(UsageError(f"--html: cannot write {path}: {exc.strerror}"))
    err.print(f"wrote {path}", highlight=False)


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
        settings = Settings.from_env()
        factory = session_factory(settings.database_url)
        run_row, videos = queries.load_report(factory, run)
        try:
            result = plan(run_row, videos, gpus=gpus, run_gpus=run_gpus, gpu_hour_usd=settings.prices.gpu.usd_per_hour,
                          gpu_hour_source=settings.prices.gpu.source, price=settings.prices.sale, headroom=headroom,
                          session_utilisation=ledger.run_ledger(factory, run_row.id)["utilisation"])
        except ValueError as exc:
            raise UsageError(f"--run {run}: {exc}") from None
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
        settings = Settings.from_env()
        rows = ledger.sessions(session_factory(settings.database_url))
    except ReelbatchError as exc:
        fail(exc)
    data = {
        "sessions": [dataclasses.asdict(r) for r in rows],
        "total_usd": sum(r.total_micro_usd for r in rows) / 1e6,
        "charged_usd": sum(r.charged_micro_usd for r in rows) / 1e6,
        "idle_usd": sum(r.idle_micro_usd for r in rows) / 1e6,
    }
    if json_:
        out.print_json(json.dumps(data))
        return
    table = Table("session", "worker", "state", "up s", "charged s", "idle s", "up $", "charged $", "idle $",
                  "rate", box=None, pad_edge=False)
    for r in rows:
        table.add_row(str(r.id), r.owner, r.state, f"{r.up_s:.1f}", f"{r.charged_s:.1f}", f"{r.idle_s:.1f}",
                      f"{r.total_micro_usd / 1e6:.6f}", f"{r.charged_micro_usd / 1e6:.6f}",
                      f"{r.idle_micro_usd / 1e6:.6f}", f"${r.rate_usd_per_hour:g}/h ({r.rate_source})")
    out.print(table)
    out.print(f"{len(rows)} worker sessions: ${data['total_usd']:.6f} up = ${data['charged_usd']:.6f} charged to "
              f"videos + ${data['idle_usd']:.6f} idle", highlight=False)
