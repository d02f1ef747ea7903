"""`reelbatch submit` and `reelbatch run`: a manifest validated and recorded as a run, its work queued; `run` also
renders it with an embedded worker and prints the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli import embedded
from jobs.cli.console import ShownFeedback, err, fail, out
from jobs.db.connect import session_factory
from jobs.errors import ReelbatchError
from jobs.reports.text import print_report
from jobs.settings import Settings
from jobs.usecases import reports
from jobs.usecases import submit as submitting
from jobs.usecases.submit import Options

ManifestArg = Annotated[Path, typer.Argument(help="A manifest file: .yaml/.yml (a run) or .jsonl (one video a line).")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Run name (JSONL: default the file's stem).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Registered model name (default: the manifest's, else tiny).")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", help="Output URI prefix: file://DIR/ or s3://BUCKET/PREFIX/.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help=(
    "FIELD=VALUE, repeatable, over the file's value: a video field as a default for every video (steps, seed, "
    "guidance, resolution, duration_s, fps, prompt, negative_prompt, image, fit) or a run field (priority, codec, "
    "crf, preset, max_cost_usd, deadline, checks.on_fail); checked as the manifest's own."))]
NotifyOpt = Annotated[Optional[str], typer.Option(
    "--notify", help="Webhook URL to POST a signed summary to when the run finishes (under REELBATCH_ALLOWED_WEBHOOKS).")]
NewRunOpt = Annotated[bool, typer.Option("--new-run", help="Always make a new run (the name gets a numeric suffix).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def options(name: str | None, model: str | None, output: str | None, sets: list[str] | None,
            notify: str | None = None) -> Options:
    return Options(name=name, model=model, output=output, sets=tuple(sets or ()), notify=notify)


def submit(manifest: ManifestArg, name: NameOpt = None, model: ModelOpt = None, output: OutputOpt = None,
           set_: SetOpt = None, notify: NotifyOpt = None, new_run: NewRunOpt = False, json_: JsonOpt = False) -> None:
    """Validate a manifest and record a run; workers render it. Prints the run id."""
    try:
        settings = Settings.from_env()
        s = submitting.submit_manifest(settings, manifest, options(name, model, output, set_, notify),
                                       new_run=new_run, feedback=ShownFeedback())
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        out.print_json(json.dumps({"run_id": s.run_id, "name": s.name, "videos": s.videos, "created": s.created,
                                   "pending": s.pending_units, "queued": s.unqueued is None,
                                   "unqueued": s.unqueued}))
    else:
        verb = "created" if s.created else "exists:"
        out.print(f"run {s.run_id} {verb} {s.name} ({s.videos} videos, {s.pending_units} pending)")
    if s.unqueued is not None:
        err.print(unqueued_line(s), highlight=False)


def unqueued_line(s) -> str:
    return (f"warning: run {s.run_id} {s.name} is recorded, but its work was not queued: {s.unqueued} "
            f"(REELBATCH_BROKER_URL). Nothing is lost: once the broker answers, the first sweep of a worker that "
            f"serves {s.model} queues its {s.pending_units} pending units.")


def run(manifest: ManifestArg, name: NameOpt = None, model: ModelOpt = None, output: OutputOpt = None,
        set_: SetOpt = None, notify: NotifyOpt = None, new_run: NewRunOpt = False, json_: JsonOpt = False) -> None:
    """Submit a manifest, render it with an embedded worker, and print the report.

    Ctrl-C (or SIGTERM): take no new work, finish the batch in hand, print the report and exit 130 (143). Ctrl-C
    again: stop the batch at its next step and hand it back. Running the same command again resumes the run."""
    interrupted = None
    try:
        settings = Settings.from_env()
        s = submitting.submit_manifest(settings, manifest, options(name, model, output, set_, notify),
                                       new_run=new_run, embedded=True, feedback=ShownFeedback())
        factory = session_factory(settings.database_url)
        resume = embedded.resume_hint(sys.argv[1:], s.name)
        if s.pending_units:
            interrupted = embedded.render(factory, s, err, resume)
        report = reports.report(settings, str(s.run_id))
    except ReelbatchError as exc:
        fail(exc)
    except KeyboardInterrupt:  # before the worker started (or after it stopped): nothing of it is left to stop
        err.print("Ctrl-C: stopped; the same command resumes", markup=False, highlight=False)
        raise typer.Exit(130) from None
    if json_:
        out.print_json(json.dumps(report))
    else:
        print_report(out, report)
    if interrupted is not None:
        done = sum(report["counts"].get(k, 0) for k in ("succeeded", "failed", "cancelled"))
        err.print(f"interrupted: {done} of {sum(report['counts'].values())} videos done; {resume}", markup=False, highlight=False,
                  soft_wrap=True)
        raise typer.Exit(128 + interrupted)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    raise typer.Exit(0 if report["counts"]["succeeded"] == sum(report["counts"].values()) else 1)
