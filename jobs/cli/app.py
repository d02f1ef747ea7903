"""The `reelbatch` command line: one Typer command or sub-app per noun, errors to stderr, `--json` for scripts."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobs.cost import ledger

from jobs.db import queries
from jobs.cli.console import err, fail, out
from jobs.db.connect import session_factory, upgrade
from jobs.errors import ReelbatchError, UsageError
from jobs.reports.summary import report_dict, print_report
from jobs.settings import Settings, absolute_output
from jobs.db.status import Status
from storage.stores import StoreError

app = typer.Typer(help="Batch-render text-to-video manifests to verified MP4s with cost records.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


ManifestArg = Annotated[Path, typer.Argument(help="A manifest file: .yaml/.yml (a run) or .jsonl (one video a line).")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Run name (JSONL: default the file's stem).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Registered model name (default: the manifest's, else tiny).")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", help="Output URI prefix: file://DIR/ or s3://BUCKET/PREFIX/.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="FIELD=VALUE default for every video; repeatable.")]
NewRunOpt = Annotated[bool, typer.Option("--new-run", help="Always make a new run (the name gets a numeric suffix).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


# A manifest with at least this many videos shows its submission's progress (stderr): validating, recording, queueing.
PROGRESS_FROM_VIDEOS = 100


def _submit(settings: Settings, manifest: Path, name, model, output, sets, new_run,
            check_gate: bool = False) -> queries.Submitted:
    from jobs.manifest.load import load_manifest

    with err.status(f"validating {manifest}"):
        spec = load_manifest(manifest, registry=settings.registry(), name=name, model=model, output=output,
                             sets=sets or (), allowed_outputs=settings.allowed_outputs)
    if check_gate and settings.engine_config().lossy():
        _check_gate(settings, spec.model)
    factory = session_factory(settings.database_url)
    large = len(spec.videos) >= PROGRESS_FROM_VIDEOS
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=not large) as bar:
        task = bar.add_task(f"recording {spec.name}", total=len(spec.videos))
        submitted = queries.submit_run(factory, spec, output=absolute_output(spec.output or settings.output),
                                       new_run=new_run)
        bar.update(task, completed=len(spec.videos))
        if submitted.pending_units:
            import jobs.work.app  # noqa: F401 - binds the tasks to the configured broker
            from jobs.work.tasks import MAX_TICKETS, send_tickets

            tickets = bar.add_task(f"queueing {submitted.name}", total=min(submitted.pending_units, MAX_TICKETS))
            send_tickets(submitted.pending_units, on_sent=lambda: bar.advance(tickets))
    return submitted


def _check_gate(settings: Settings, model: str) -> None:
    """The embedded worker renders with this process's settings: refuse an ungated lossy one before writing."""
    from engine.engine import Engine
    from engine.gates import UngatedSetting

    try:
        Engine(settings.engine_config(), settings.registry()).check_gate(model)
    except UngatedSetting as exc:
        raise UsageError(f"REELBATCH_STEP_CACHE / REELBATCH_GUIDANCE_FRACTION / REELBATCH_STEP_SCALE: {exc}") from None


@app.command()
def submit(manifest: ManifestArg, name: NameOpt = None, model: ModelOpt = None, output: OutputOpt = None,
           set_: SetOpt = None, new_run: NewRunOpt = False, json_: JsonOpt = False) -> None:
    """Validate a manifest and record a run; workers render it. Prints the run id."""
    try:
        settings = Settings.from_env()
        s = _submit(settings, manifest, name, model, output, set_, new_run)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"run_id": s.run_id, "name": s.name, "videos": s.videos, "created": s.created,
                                   "pending": s.pending_units}))
    else:
        verb = "created" if s.created else "exists:"
        out.print(f"run {s.run_id} {verb} {s.name} ({s.videos} videos, {s.pending_units} pending)")


@app.command()
def run(manifest: ManifestArg, name: NameOpt = None, model: ModelOpt = None, output: OutputOpt = None,
        set_: SetOpt = None, new_run: NewRunOpt = False, json_: JsonOpt = False) -> None:
    """Submit a manifest, render it with an embedded worker, and print the report."""
    try:
        settings = Settings.from_env()
        s = _submit(settings, manifest, name, model, output, set_, new_run, check_gate=True)
        factory = session_factory(settings.database_url)
        if s.pending_units:
            _render_with_embedded_worker(factory, s)
        run_row, videos = queries.load_report(factory, str(s.run_id))
    except ReelbatchError as exc:
        fail(exc)
    report = report_dict(run_row, videos, settings.price(), ledger.run_ledger(factory, run_row.id))
    if json_:
        out.print_json(json.dumps(report))
    else:
        print_report(out, report)
    raise typer.Exit(0 if report["counts"]["succeeded"] == len(videos) else 1)


def _render_with_embedded_worker(factory, submitted: queries.Submitted) -> None:
    """Start `reelbatch worker` as a child process and show progress until every video of the run is done."""
    log = tempfile.NamedTemporaryFile(prefix="reelbatch-worker-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "jobs", "worker", "--concurrency", "1", "--pool", "solo"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err, transient=False) as bar:
            task = bar.add_task(f"rendering {submitted.name}", total=submitted.videos)
            while True:
                (counts,) = queries.run_counts(factory, str(submitted.run_id))
                finished = sum(n for k, n in counts.counts.items() if Status(k).terminal)
                bar.update(task, completed=finished)
                if counts.done:
                    break
                if proc.poll() is not None:
                    raise ReelbatchError(f"the embedded worker exited with code {proc.returncode}; "
                                         f"its log: {log.name}\n{_tail(log.name)}")
                time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # warm shutdown: Celery finishes the ticket in hand
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    os.unlink(log.name)


def _tail(path: str, lines: int = 30) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


@app.command()
def worker(
    queue: Annotated[Optional[str], typer.Option(help="Queue to consume (default REELBATCH_QUEUE, else render).")] = None,
    concurrency: Annotated[int, typer.Option(help="Processes that render (one per GPU).")] = 1,
    pool: Annotated[str, typer.Option(help="solo: render in this process; prefork: in child processes, with hard "
                                           "time limits (CUDA starts only in the children).")] = "solo",
    max_batch: Annotated[Optional[int], typer.Option(help="Largest same-shape batch (default REELBATCH_MAX_BATCH).")] = None,
    gpu_rate: Annotated[Optional[float], typer.Option(help="USD per GPU-hour for cost records (default REELBATCH_GPU_HOUR_USD).")] = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    log_format: Annotated[str, typer.Option("--log-format", help="text, or json: one JSON object per line, with "
                                                                 "the batch's run and video ids.")] = "text",
) -> None:
    """Run a Celery worker that claims and renders queued work. SIGTERM: finish the batch in hand, then stop."""
    if pool not in ("solo", "prefork"):
        fail(UsageError(f"--pool must be solo or prefork, got {pool!r}"))
    if log_format not in ("text", "json"):
        fail(UsageError(f"--log-format must be text or json, got {log_format!r}"))
    os.environ["REELBATCH_LOG_FORMAT"] = log_format
    if pool == "solo" and concurrency != 1:
        fail(UsageError("--pool solo renders in one process: use --pool prefork for --concurrency above 1"))
    # The options become the environment the task processes read their Settings from.
    for name, value in (("REELBATCH_MAX_BATCH", max_batch), ("REELBATCH_GPU_HOUR_USD", gpu_rate),
                        ("REELBATCH_QUEUE", queue)):
        if value is not None:
            os.environ[name] = str(value)
    os.environ["REELBATCH_POOL"] = pool
    try:
        settings = Settings.from_env()
        session_factory(settings.database_url)  # refuse to start against a schema this code does not know
        settings.registry()
        from jobs.work.app import check_worker_config, control_queue, create_app

        check_worker_config(settings)
    except ReelbatchError as exc:
        fail(exc)
    queues = f"{settings.queue},{control_queue(settings)}"
    create_app(settings).worker_main(["worker", "-Q", queues, "-c", str(concurrency), "-P", pool,
                                      "-l", loglevel, "--without-gossip", "--without-mingle"])


@app.command()
def cancel(run: Annotated[str, typer.Argument(help="Run name or id.")]) -> None:
    """Cancel a run: pending videos now, running batches at their next step. Idempotent."""
    try:
        name, count = queries.cancel_run(session_factory(Settings.from_env().database_url), run)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {name}: {count} pending videos cancelled; running batches stop at their next step")


@app.command()
def resume(run: Annotated[str, typer.Argument(help="Run name or id.")]) -> None:
    """Put a run's failed and cancelled videos back in the queue, with fresh attempts. Idempotent."""
    try:
        name, count = queries.resume_run(session_factory(Settings.from_env().database_url), run)
        if count:
            import jobs.work.app  # noqa: F401 - binds the tasks to the configured broker
            from jobs.work.tasks import send_tickets

            send_tickets(count)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"run {name}: {count} videos back in the queue")


@app.command()
def status(run: Annotated[Optional[str], typer.Argument(help="Run name or id (default: all runs).")] = None,
           json_: JsonOpt = False) -> None:
    """Runs and their video counts by status."""
    try:
        rows = queries.run_counts(session_factory(Settings.from_env().database_url), run)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"runs": [
            {"run_id": r.run_id, "name": r.name, "model": r.model, "created_at": r.created_at.isoformat(),
             "total": r.total, "counts": r.counts} for r in rows]}))
        return

    table = Table("run", "name", "model", "total", "pending", "running", "succeeded", "failed", "cancelled",
                  box=None, pad_edge=False)
    for r in rows:
        table.add_row(str(r.run_id), r.name, r.model, str(r.total), *(str(r.counts[k]) for k in
                      ("pending", "running", "succeeded", "failed", "cancelled")))
    out.print(table)


@app.command()
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
        run_row, videos = queries.load_report(factory, run)
        if results:
            from jobs.reports.results import write_results

            try:
                for uri in write_results(factory, run):
                    err.print(f"wrote {uri}", highlight=False)
            except StoreError as exc:
                raise ReelbatchError(f"writing the result files of run {run}: {exc}") from None
    except ReelbatchError as exc:
        fail(exc)
    data = report_dict(run_row, videos, settings.price(), ledger.run_ledger(factory, run_row.id))
    if html_file is not None:
        _write_html(html_file, data, run_row, videos, settings)
    if json_:
        out.print_json(json.dumps(data))
    else:
        print_report(out, data)


def _write_html(path: Path, data: dict, run_row, videos, settings: Settings) -> None:
    from jobs.reports.html import html_report
    from storage.encode import decode_frames
    from storage.stores import open_store

    store = open_store(run_row.output)

    def frames_of(video):
        try:
            return decode_frames(store.get(f"{run_row.name}/{video.key}.mp4"))
        except StoreError as exc:
            err.print(f"{video.key}: not in the contact sheet: {exc}", markup=False, highlight=False)
            return None

    try:
        path.write_text(html_report(data, run_row, videos, frames_of, settings.gpu_hour_usd), encoding="utf-8")
    except OSError as exc:
        fail(UsageError(f"--html: cannot write {path}: {exc.strerror}"))
    err.print(f"wrote {path}", highlight=False)


@app.command()
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
    from jobs.cost.capacity import plan

    try:
        settings = Settings.from_env()
        factory = session_factory(settings.database_url)
        run_row, videos = queries.load_report(factory, run)
        try:
            result = plan(run_row, videos, gpus=gpus, run_gpus=run_gpus, gpu_hour_usd=settings.gpu_hour_usd,
                          gpu_hour_source=settings.gpu_hour_source, price=settings.price(), headroom=headroom,
                          session_utilisation=ledger.run_ledger(factory, run_row.id)["utilisation"])
        except ValueError as exc:
            raise UsageError(f"--run {run}: {exc}") from None
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps(result))
        return
    out.print(f"[bold]capacity[/bold] of {gpus} GPU(s), from run {result['run']}", highlight=False)
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


@app.command("ledger")
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


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply Alembic migrations up to REVISION (default: head)."""
    url = Settings.from_env().database_url
    upgrade(url, revision)
    out.print(f"database upgraded to {revision}")


from jobs.cli.schedule import beat, schedule_app  # noqa: E402

app.add_typer(schedule_app, name="schedule")
app.command()(beat)

from jobs.cli.quality import quality  # noqa: E402
from jobs.cli.toy import toy_app  # noqa: E402

app.command()(quality)
app.add_typer(toy_app, name="toy")

from jobs.cli.bench import bench  # noqa: E402

app.command()(bench)
