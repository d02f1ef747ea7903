"""Submit: a manifest checked completely, recorded as a run with its videos and work units in one transaction, and
its work queued as tickets. What `reelbatch submit`, `reelbatch run` and POST /v1/runs do."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.errors import UsageError
from jobs.manifest import load_manifest
from jobs.manifest.specs import RunSpec
from jobs.settings import Settings
from jobs.usecases import envelopes, parallel
from jobs.usecases.feedback import SILENT, Feedback

log = logging.getLogger(__name__)

# A manifest with at least this many videos reports its recording and queueing as counts.
PROGRESS_FROM_VIDEOS = 100


@dataclass(frozen=True)
class Options:
    """The run options both doors take (the CLI's flags, the API's query parameters); None: the manifest's own."""

    name: str | None = None
    model: str | None = None
    output: str | None = None
    sets: tuple[str, ...] = ()
    notify: str | None = None
    # Over the API: the run's name may not be all digits (`/v1/runs/1` is always run 1) nor start with '.'.
    served: bool = False


class Refused(UsageError):
    """A request the server refuses whatever the manifest's own checks say (an output outside the team's root, a
    name the API does not take): the API's 400."""


def check_served_name(name: str, named_by: str) -> None:
    """A run name a request over the API may take: a path segment of its own, never read as an id or a dot-file."""
    if name.isascii() and name.isdigit():
        raise Refused(f"{named_by}: run name {name!r} is all digits, which the API reads as a run id: add a letter")
    if name.startswith("."):
        raise Refused(f"{named_by}: run name {name!r} starts with '.': start it with a letter or digit")


def check_signable(settings: Settings, manifest: Path, spec: RunSpec) -> None:
    """A run with `notify` needs the secret its deliveries are signed with: refused without it (by `estimate` too,
    which checks as `submit` does)."""
    if spec.notify is not None and settings.webhooks.secret is None:
        raise UsageError(f"{manifest}: notify {spec.notify!r}: REELBATCH_WEBHOOK_SECRET is not set, so its "
                         "deliveries could not be signed; set it here and on every worker")


def read_manifest(settings: Settings, manifest: Path, options: Options, feedback: Feedback = SILENT) -> RunSpec:
    """The manifest checked as every way in checks it (the settings' policy, the memory envelopes recorded), with
    the options applied."""
    with feedback.phase(f"validating {manifest}"):
        spec = load_manifest(manifest, registry=settings.registry(), name=options.name, model=options.model,
                             output=options.output, notify=options.notify, sets=options.sets,
                             policy=settings.manifest)
    if options.served:
        check_served_name(spec.name, f"{manifest.name}: name")
    check_signable(settings, manifest, spec)
    envelopes.check(settings, manifest, spec)  # a video that fits no measured device's memory
    parallel.check(settings, manifest, spec)  # a video the settings' ranks cannot split
    return spec


def check_gates(settings: Settings, spec: RunSpec, named_by: str, embedded: bool) -> None:
    """Refuse, before anything is written, a run no worker would claim: a lossy setting or a distilled model with no
    passing quality gate, or a precision this device cannot render. `embedded`: `run`'s own worker renders here with
    this process's settings, so this device's precision is checked too."""
    registration = settings.registry().get(spec.model)
    precision = registration.precision or settings.engine.precision
    text_precision = registration.text_encoder_precision  # engine.levers.precision.text_encoder_mode
    if (settings.engine_config().lossy() or registration.teacher
            or (embedded and (precision != "auto" or text_precision is not None))):
        from jobs.quality.evaluate import gated_engine  # here, not at the top: torch only when a gate is checked

        # Workers refuse to claim what has no passing gate (jobs.render.serving.gated_models): one message here.
        gated_engine(settings, settings.registry(), spec.model, named_by=named_by)
    elif precision not in ("auto", "fp32", "bf16") or text_precision not in (None, "auto", "fp32", "bf16"):
        from jobs.quality.evaluate import check_submitted_precision  # here: torch only when a gate is checked

        check_submitted_precision(settings, settings.registry(), spec.model)


def submit_manifest(settings: Settings, manifest: Path, options: Options = Options(), *, new_run: bool = False,
                    team_id: int | None = None, source: str | None = None, embedded: bool = False,
                    tickets: int | None = None, feedback: Feedback = SILENT) -> submission.Submitted:
    """Check the manifest, record the run for `team_id` (None: the default team), queue its work. `source`: what
    the run says it came from (default: the manifest's path). `tickets`: send at most this many of its tickets now
    (None: all); the service sends the rest after answering (`send_more_tickets`)."""
    spec = read_manifest(settings, manifest, options, feedback)
    if source is not None:
        spec = dataclasses.replace(spec, source=source)
    check_gates(settings, spec, named_by=str(manifest), embedded=embedded)
    factory = session_factory(settings.database_url)
    shown = feedback if len(spec.videos) >= PROGRESS_FROM_VIDEOS else SILENT
    with shown.count(f"recording {spec.name}", len(spec.videos)) as advance:
        submitted = submission.submit_run(factory, spec, output=spec.output, new_run=new_run, team_id=team_id)
        advance(len(spec.videos))
    # An unchanged resubmission is a lookup: its work was queued when it was recorded, and a ticket that went missing
    # since is sent again by a worker's sweep (jobs.work.sweeper). `run`'s embedded worker starts now, so it gets
    # tickets for what is pending.
    if submitted.pending_units and (submitted.created or embedded):
        import kombu.exceptions

        from jobs.work.app import create_app  # here, not at the top: Celery is only for use cases that queue
        from jobs.work.tickets import MAX_TICKETS, send_tickets

        count = min(submitted.pending_units, MAX_TICKETS if tickets is None else min(tickets, MAX_TICKETS))
        try:
            with shown.count(f"queueing {submitted.name}", count) as advance:
                send_tickets(create_app(settings), count, submitted.model, on_sent=lambda: advance(1))
        except kombu.exceptions.OperationalError as exc:
            if embedded:
                raise  # `run` cannot render without its broker: jobs.main says so in one line, and the run stays
            # The run is recorded (one transaction, before any ticket): it stays, and its work is claimable. The
            # first sweep of a worker that serves its model once the broker answers queues it (jobs.work.sweeper).
            return dataclasses.replace(submitted, unqueued=f"the broker cannot be reached ({_said(exc)})")
    return submitted


def send_more_tickets(settings: Settings, name: str, model: str, pending: int, sent: int) -> int:
    """The rest of a run's tickets (up to MAX_TICKETS for its `pending` units), after `sent` went with the request
    that queued them (a 100,000-video run's 5,000 take the SQLite broker about 30 s, which a client need not wait
    for). A broker that stops answering meanwhile loses nothing: the work is recorded, and workers' sweeps ticket it
    (jobs.work.sweeper). How many were sent."""
    import kombu.exceptions

    from jobs.work.app import create_app
    from jobs.work.tickets import MAX_TICKETS, send_tickets

    count = min(pending, MAX_TICKETS) - sent
    if count <= 0:
        return 0
    try:
        return send_tickets(create_app(settings), count, model)
    except kombu.exceptions.OperationalError as exc:
        log.warning("run %s: %d tickets not sent, the broker cannot be reached (%s); workers' sweeps queue its work",
                    name, count, _said(exc))
        return 0


def _said(exc: Exception) -> str:
    return str(exc).strip().rstrip(".").splitlines()[0] if str(exc).strip() else type(exc).__name__
