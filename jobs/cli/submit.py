"""`reelbatch submit` and `reelbatch run`: a manifest validated and recorded as a run, its work queued; `run` also
renders it with an embedded worker and prints the report."""

from __future__ import annotations

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

from jobs.cli.console import err, fail, out
from jobs.cost import ledger
from jobs.db import queries
from jobs.db.connect import session_factory
from jobs.db.status import Status
from jobs.errors import ReelbatchError, UsageError
from jobs.manifest import load_manifest
from jobs.reports.summary import report_dict
from jobs.reports.text import print_report
from jobs.settings import Settings, absolute_output

ManifestArg = Annotated[Path, typer.Argument(help="A manifest file: .yaml/.yml (a run) or .jsonl (one video a line).")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Run name (JSONL: default the file's stem).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Registered model name (default: the manifest's, else tiny).")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", help="Output URI prefix: file://DIR/ or s3://BUCKET/PREFIX/.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="FIELD=VALUE default for every video; repeatable.")]
NewRunOpt = Annotated[bool, typer.Option("--new-run", help="Always make a new run (the name gets a numeric suffix).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]

# A manifest with at least this many videos shows its submission's progress (stderr): validating, recording, queueing.
PROGRESS_FROM_VIDEOS = 100


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


def _submit(settings: Settings, manifest: Path, name, model, output, sets, new_run,
            check_gate: bool = False) -> queries.Submitted:
    with err.status(f"validating {manifest}"):
        spec = load_manifest(manifest, registry=settings.registry(), name=name, model=model, output=output,
                             sets=sets or (), allowed_outputs=settings.allowed_outputs,
                             allowed_inputs=settings.allowed_inputs)
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
            from jobs.work.app import create_app  # here, not at the top: Celery is only for commands that queue
            from jobs.work.tickets import MAX_TICKETS, send_tickets

            tickets = bar.add_task(f"queueing {submitted.name}", total=min(submitted.pending_units, MAX_TICKETS))
            send_tickets(create_app(settings), submitted.pending_units, on_sent=lambda: bar.advance(tickets))
    return submitted


def _check_gate(settings: Settings, model: str) -> None:
    """The embedded worker renders with this process's settings: refuse an ungated lossy one before writing."""
    from engine.engine import Engine  # here, not at the top: torch only when a lossy setting must be checked
    from engine.gates import UngatedSetting

    try:
        Engine(settings.engine_config(), settings.registry()).check_gate(model)
    except UngatedSetting as exc:
        raise UsageError(f"REELBATCH_STEP_CACHE / REELBATCH_GUIDANCE_FRACTION / REELBATCH_STEP_SCALE: {exc}") from None


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
