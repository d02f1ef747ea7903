"""`reelbatch submit` and `reelbatch run`: a manifest validated and recorded as a run, its work queued; `run` also
renders it with an embedded worker and prints the report."""

from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from jobs.cli import embedded
from jobs.cli.console import err, fail, literal, out, progress_text, visible
from jobs.cost import ledger
from jobs.db import queries, submission
from jobs.db.connect import session_factory
from jobs.errors import ReelbatchError, UsageError
from jobs.manifest import load_manifest
from jobs.reports.summary import report_dict
from jobs.reports.text import print_report
from jobs.settings import Settings

ManifestArg = Annotated[Path, typer.Argument(help="A manifest file: .yaml/.yml (a run) or .jsonl (one video a line).")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Run name (JSONL: default the file's stem).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Registered model name (default: the manifest's, else tiny).")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", help="Output URI prefix: file://DIR/ or s3://BUCKET/PREFIX/.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="FIELD=VALUE default for every video; repeatable.")]
NotifyOpt = Annotated[Optional[str], typer.Option(
    "--notify", help="Webhook URL to POST a signed summary to when the run finishes (under REELBATCH_ALLOWED_WEBHOOKS).")]
NewRunOpt = Annotated[bool, typer.Option("--new-run", help="Always make a new run (the name gets a numeric suffix).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]

# A manifest with at least this many videos shows its submission's progress (stderr): validating, recording, queueing.
PROGRESS_FROM_VIDEOS = 100


def submit(manifest: ManifestArg, name: NameOpt = None, model: ModelOpt = None, output: OutputOpt = None,
           set_: SetOpt = None, notify: NotifyOpt = None, new_run: NewRunOpt = False, json_: JsonOpt = False) -> None:
    """Validate a manifest and record a run; workers render it. Prints the run id."""
    try:
        settings = Settings.from_env()
        s = submit_manifest(settings, manifest, name, model, output, set_, notify, new_run)
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"run_id": s.run_id, "name": s.name, "videos": s.videos, "created": s.created,
                                   "pending": s.pending_units}))
    else:
        verb = "created" if s.created else "exists:"
        out.print(f"run {s.run_id} {verb} {s.name} ({s.videos} videos, {s.pending_units} pending)")


def run(manifest: ManifestArg, name: NameOpt = None, model: ModelOpt = None, output: OutputOpt = None,
        set_: SetOpt = None, notify: NotifyOpt = None, new_run: NewRunOpt = False, json_: JsonOpt = False) -> None:
    """Submit a manifest, render it with an embedded worker, and print the report.

    Ctrl-C (or SIGTERM): take no new work, finish the batch in hand, print the report and exit 130 (143). Ctrl-C
    again: stop the batch at its next step and hand it back. Running the same command again resumes the run."""
    interrupted = None
    try:
        settings = Settings.from_env()
        s = submit_manifest(settings, manifest, name, model, output, set_, notify, new_run, embedded=True)
        factory = session_factory(settings.database_url)
        resume = embedded.resume_hint(sys.argv[1:], s.name)
        if s.pending_units:
            interrupted = embedded.render(factory, s, err, resume)
        run_row, videos = queries.load_report(factory, str(s.run_id))
    except ReelbatchError as exc:
        fail(exc)
    except KeyboardInterrupt:  # before the worker started (or after it stopped): nothing of it is left to stop
        err.print("Ctrl-C: stopped; the same command resumes", markup=False, highlight=False)
        raise typer.Exit(130) from None
    report = report_dict(run_row, videos, settings.prices.sale, ledger.run_ledger(factory, run_row.id))
    if json_:
        out.print_json(json.dumps(report))
    else:
        print_report(out, report)
    if interrupted is not None:
        done = sum(report["counts"].get(k, 0) for k in ("succeeded", "failed", "cancelled"))
        err.print(f"interrupted: {done} of {len(videos)} videos done; {resume}", markup=False, highlight=False,
                  soft_wrap=True)
        raise typer.Exit(128 + interrupted)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    raise typer.Exit(0 if report["counts"]["succeeded"] == len(videos) else 1)


def check_signable(settings: Settings, manifest: Path, spec) -> None:
    """A run with `notify` needs the secret its deliveries are signed with: refused without it (by `estimate` too,
    which checks as `submit` does)."""
    if spec.notify is not None and settings.webhooks.secret is None:
        raise UsageError(f"{manifest}: notify {spec.notify!r}: REELBATCH_WEBHOOK_SECRET is not set, so its "
                         "deliveries could not be signed; set it here and on every worker")


def submit_manifest(settings: Settings, manifest: Path, name, model, output, sets, notify, new_run,
                    team_id: int | None = None, source: str | None = None,
                    quiet: bool = False, embedded: bool = False) -> submission.Submitted:
    """What `submit` does, for it and for the HTTP API (jobs.service): check the manifest, record the run for
    `team_id` (None: the default team), queue its work. `source`: what the run says it came from (default: the
    manifest's path). Progress goes to stderr for large manifests, unless `quiet` (a server's threads: rich shows
    one live display at a time). `embedded`: `run`'s worker renders here, so this device's precision is checked
    too."""
    with nullcontext() if quiet else err.status(literal(f"validating {manifest}")):
        spec = load_manifest(manifest, registry=settings.registry(), name=name, model=model, output=output,
                             notify=notify, sets=sets or (), policy=settings.manifest)
    if source is not None:
        spec = dataclasses.replace(spec, source=source)
    check_signable(settings, manifest, spec)
    precision = settings.registry().get(spec.model).precision or settings.engine.precision
    text_precision = settings.registry().get(spec.model).text_encoder_precision  # engine.precision.text_encoder_mode
    if (settings.engine_config().lossy() or settings.registry().get(spec.model).teacher
            or (embedded and (precision != "auto" or text_precision is not None))):
        from jobs.quality.evaluate import gated_engine  # here, not at the top: torch only when a gate is checked

        # `run`'s embedded worker renders with this process's settings, and `submit`'s workers refuse to claim what
        # has no passing gate (jobs.render.serving.gated_models): refuse it here, before writing, with one message.
        gated_engine(settings, settings.registry(), spec.model, named_by=str(manifest))
    elif precision not in ("auto", "fp32", "bf16") or text_precision not in (None, "auto", "fp32", "bf16"):
        from jobs.quality.evaluate import check_submitted_precision  # here: torch only when a gate is checked

        check_submitted_precision(settings, settings.registry(), spec.model)
    factory = session_factory(settings.database_url)
    large = len(spec.videos) >= PROGRESS_FROM_VIDEOS
    columns = (progress_text(), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=quiet or not large) as bar:
        task = bar.add_task(visible(f"recording {spec.name}"), total=len(spec.videos))
        submitted = submission.submit_run(factory, spec, output=spec.output, new_run=new_run, team_id=team_id)
        bar.update(task, completed=len(spec.videos))
        if submitted.pending_units:
            from jobs.work.app import create_app  # here, not at the top: Celery is only for commands that queue
            from jobs.work.tickets import MAX_TICKETS, send_tickets

            tickets = bar.add_task(visible(f"queueing {submitted.name}"),
                                   total=min(submitted.pending_units, MAX_TICKETS))
            send_tickets(create_app(settings), submitted.pending_units, submitted.model,
                         on_sent=lambda: bar.advance(tickets))
    return submitted
