"""Schedules: a manifest submitted on a cron schedule. Plain functions: `reelbatch beat` only decides when a worker
calls `fire_due` (the `reelbatch.fire_schedules` task).

The rule: each fire time of a schedule makes at most one run, named `{schedule}-{fire time, UTC, %Y%m%dT%H%M%SZ}`.
Crons are read in UTC. The fire time due at `now` is the latest one at or before `now`, if it is after the schedule
was added; fire times missed while nothing ran are not made up: only the most recent one fires.

Exactly once, whoever calls (two beats, a restart): `fire_due` first inserts the firing row in a transaction of its
own, and the unique (schedule, fire time) lets one caller have it. The run is made after that commit, so a firing can
exist without an outcome (its process died): `ok` false and no `errors`, shown as "in progress". A later `fire_due`
takes over a firing left so for RESUME_AFTER (a conditional update: one taker) and finishes it, which can never make
a second run: the run's name is fixed by the fire time and unique among runs, `submit_run` makes a run and its videos
in one transaction and returns the existing run for the same name and content, and a taker that finds the run
already made adopts it rather than submitting again (the manifest may have changed since). Tickets are sent before
the firing is marked finished, so a crash between the two re-sends them; extra tickets are harmless.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath

from croniter import CroniterBadDateError, CroniterError, croniter
from sqlalchemy import delete, false, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from jobs.db import queries
from jobs.errors import UsageError
from jobs.manifest.load import ManifestError, RunSpec, load_manifest
from jobs.manifest.fields import MAX_FILE_BYTES, MAX_NAME_CHARS, FieldError, check_name
from jobs.db.rows import Firing, Run, Schedule, utcnow
from jobs.settings import Settings, absolute_output

log = logging.getLogger(__name__)

STAMP = "%Y%m%dT%H%M%SZ"
# A run name is `{schedule}-{stamp}` and must fit the 128 characters of a run name.
MAX_SCHEDULE_NAME = MAX_NAME_CHARS - len("-") - len("20260101T020000Z")
# How long a firing may stay in progress before another caller finishes it. Longer than a slow firing (a 64 MiB
# manifest from S3, 100,000 videos inserted); correctness does not depend on it, only how often work is duplicated.
RESUME_AFTER = timedelta(minutes=10)
# Errors stored on a failed firing: enough for every issue of any sane manifest, bounded for an insane one.
MAX_ERROR_CHARS = 16_000


@dataclass(frozen=True)
class FiringResult:
    schedule: str
    fire_time: datetime  # UTC
    run_name: str
    ok: bool
    run_id: int | None
    errors: str | None
    resumed: bool = False  # finished a firing another process began and left in progress

    @property
    def state(self) -> str:
        return "ok" if self.ok else "in progress" if self.errors is None else "failed"


@dataclass(frozen=True)
class ScheduleInfo:
    name: str
    manifest: str
    cron: str
    created_at: datetime
    next_fire_time: datetime | None
    last_firing: FiringResult | None


def run_name_for(schedule: str, fire_time: datetime) -> str:
    return f"{schedule}-{fire_time.astimezone(timezone.utc).strftime(STAMP)}"


def due_fire_time(cron: str, created_at: datetime, now: datetime) -> datetime | None:
    """The latest fire time at or before `now`, if it is after `created_at`; else None."""
    # croniter's get_prev is strictly before its start; crons have whole-second resolution, so start 1 s past now.
    latest = croniter(cron, now.replace(microsecond=0) + timedelta(seconds=1)).get_prev(datetime).replace(fold=0)
    return latest if latest > _utc(created_at) else None


def add_schedule(factory: queries.Factory, name: str, manifest: str, cron: str) -> ScheduleInfo:
    name, cron, manifest = _check_name(name), check_cron(cron), check_manifest(manifest)
    try:
        with factory.begin() as s:
            if s.scalar(select(Schedule.id).where(Schedule.name == name)) is None:
                s.add(Schedule(name=name, manifest=manifest, cron=cron))
                s.flush()
                return _infos(s, name)[0]
    except IntegrityError:
        pass  # added by someone else between the check and the insert
    raise UsageError(f"a schedule named {name!r} already exists (see `reelbatch schedule list`); remove it first")


def list_schedules(factory: queries.Factory) -> list[ScheduleInfo]:
    with factory() as s:
        return _infos(s)


def remove_schedule(factory: queries.Factory, name: str) -> None:
    """Remove a schedule and its firings (the database cascades); the runs it made stay."""
    with factory.begin() as s:
        if s.execute(delete(Schedule).where(Schedule.name == name)).rowcount == 0:
            raise UsageError(f"no schedule named {name!r} (see `reelbatch schedule list`)")


def _infos(s, name: str | None = None) -> list[ScheduleInfo]:
    latest = (select(Firing.schedule_id, func.max(Firing.fire_time).label("fire_time"))
              .group_by(Firing.schedule_id).subquery())
    query = (select(Schedule, Firing).outerjoin(latest, latest.c.schedule_id == Schedule.id)
             .outerjoin(Firing, (Firing.schedule_id == Schedule.id) & (Firing.fire_time == latest.c.fire_time))
             .order_by(Schedule.name))
    if name is not None:
        query = query.where(Schedule.name == name)
    now = utcnow()
    return [ScheduleInfo(sc.name, sc.manifest, sc.cron, _utc(sc.created_at),
                         croniter(sc.cron, max(now, _utc(sc.created_at))).get_next(datetime).replace(fold=0),
                         None if f is None else FiringResult(sc.name, _utc(f.fire_time),
                                                             run_name_for(sc.name, f.fire_time), f.ok, f.run_id,
                                                             f.errors))
            for sc, f in s.execute(query).all()]


def _check_name(name: str) -> str:
    try:
        name = check_name(name, None)  # the run name rule: the name becomes part of every run's name
    except FieldError as exc:
        raise UsageError(f"schedule name {name!r}: {exc}") from None
    if len(name) > MAX_SCHEDULE_NAME:
        raise UsageError(f"schedule name {name!r} is {len(name)} characters; at most {MAX_SCHEDULE_NAME}, so that "
                         f"NAME-YYYYmmddTHHMMSSZ fits the {MAX_NAME_CHARS} characters of a run name")
    return name


def check_cron(expr: str) -> str:
    """5 fields (minute hour day-of-month month day-of-week), or 6 with seconds last (croniter's order); UTC."""
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise UsageError(f"cron expression {expr!r} has {len(fields)} fields: write 5 (minute hour day-of-month "
                         "month day-of-week, e.g. '0 2 * * *' for 02:00 UTC daily) or 6 (a seconds field last)")
    expr = " ".join(fields)
    try:
        croniter(expr, utcnow()).get_next(datetime)
    except CroniterBadDateError:
        raise UsageError(f"cron expression {expr!r} never fires (no such date)") from None
    except (CroniterError, ValueError) as exc:
        raise UsageError(f"cron expression {expr!r} is not valid: {exc}") from None
    return expr


def check_manifest(manifest: str) -> str:
    """A local manifest file, made absolute (workers read it at that path), or an existing s3://BUCKET/KEY."""
    s3 = _s3_parts(manifest) if manifest.startswith("s3://") else None
    if s3 is None and "://" in manifest:
        raise UsageError(f"manifest {manifest!r}: give a file path or an s3://BUCKET/KEY URI")
    if PurePosixPath(s3[1] if s3 else manifest).suffix.lower() not in (".yaml", ".yml", ".jsonl"):
        raise UsageError(f"manifest {manifest!r} is not a manifest name: use .yaml or .yml (a run) or .jsonl")
    if s3:
        with _s3(manifest) as client:
            client.head_object(Bucket=s3[0], Key=s3[1])
        return manifest
    path = os.path.abspath(manifest)  # abspath, not resolve(), as for outputs: the path stays as written
    if not os.path.isfile(path):
        raise UsageError(f"manifest {path!r} is not a file" if os.path.exists(path) else f"no file {path!r}")
    if not os.access(path, os.R_OK):
        raise UsageError(f"manifest {path!r} cannot be read (permissions)")
    return path


def fire_due(factory: queries.Factory, settings: Settings, now: datetime) -> list[FiringResult]:
    """Fire every schedule whose latest fire time at or before `now` (aware) is after its creation and not yet fired,
    and finish firings another process left in progress for RESUME_AFTER. Returns the firings this call made or
    finished; a firing another caller already has is skipped. A bad or unreadable manifest is a failed firing
    (`ok` false, `errors`), never an exception; an unexpected error is logged and its firing finished later.
    """
    if now.tzinfo is None:
        raise ValueError("fire_due needs an aware `now` (UTC)")
    now = now.astimezone(timezone.utc)
    with factory() as s:
        last = dict(s.execute(select(Firing.schedule_id, func.max(Firing.fire_time))
                              .group_by(Firing.schedule_id)).all())
        schedules = list(s.scalars(select(Schedule).order_by(Schedule.id)))
        # Read first, so that a tick with nothing to take over writes nothing (SQLite: takes no write lock).
        stale = list(s.scalars(select(Firing.id).where(*_stale())))
    taken: dict[int, list] = {}
    for firing_id, schedule_id, fire_time in _take_over(factory, stale) if stale else ():
        taken.setdefault(schedule_id, []).append((firing_id, _utc(fire_time), True))
    results = []
    for sc in schedules:
        claimed = []
        due = due_fire_time(sc.cron, sc.created_at, now)
        # Only later than the last firing: a beat whose clock lags another's never fires an older slot.
        if due is not None and (sc.id not in last or due > _utc(last[sc.id])):
            firing_id = _claim(factory, sc.id, due)
            if firing_id is not None:
                claimed.append((firing_id, due, False))
        claimed += taken.get(sc.id, [])
        for firing_id, fire_time, resumed in claimed:
            try:
                results.append(_complete(factory, settings, sc, firing_id, fire_time, resumed))
            except Exception:  # one schedule's trouble must not hold up the others
                log.exception("schedule %s: firing %s failed unexpectedly; it will be finished after %s",
                              sc.name, fire_time.strftime(STAMP), RESUME_AFTER)
    return results


def _claim(factory: queries.Factory, schedule_id: int, fire_time: datetime) -> int | None:
    """Insert the firing, in progress; None if another caller has it (or the schedule was just removed)."""
    try:
        with factory.begin() as s:
            return s.scalar(insert(Firing).values(schedule_id=schedule_id, fire_time=fire_time, ok=False)
                            .returning(Firing.id))
    except IntegrityError:
        return None


def _stale() -> tuple:
    """Firings in progress (`ok` false, no `errors`) untouched for RESUME_AFTER: their process is presumed dead."""
    return Firing.ok == false(), Firing.errors.is_(None), Firing.updated_at < utcnow() - RESUME_AFTER


def _take_over(factory: queries.Factory, ids: list[int]) -> list[tuple[int, int, datetime]]:
    """(id, schedule id, fire time) of the firings we take over. Touching `updated_at` in the same conditional
    update makes this caller their one taker, and gives us RESUME_AFTER before anyone takes them from us."""
    with factory.begin() as s:
        return [tuple(row) for row in s.execute(
            update(Firing).where(Firing.id.in_(ids), *_stale()).values(updated_at=utcnow())
            .returning(Firing.id, Firing.schedule_id, Firing.fire_time))]


def _complete(factory, settings: Settings, sc: Schedule, firing_id: int, fire_time: datetime,
              resumed: bool) -> FiringResult:
    run_name = run_name_for(sc.name, fire_time)
    run_id = None
    if resumed:
        with factory() as s:
            run_id = s.scalar(select(Run.id).where(Run.name == run_name))
    if run_id is not None:  # the process that died had made the run: adopt it
        pending = queries.pending_unit_count(factory, run_name)
    else:
        try:
            submitted = _submit(factory, settings, _load(settings, sc.manifest, run_name))
        except UsageError as exc:  # a bad or unreadable manifest, or the run name taken by other content
            errors = str(exc)
            if len(errors) > MAX_ERROR_CHARS:
                errors = f"{errors[:MAX_ERROR_CHARS]}\n... ({len(errors) - MAX_ERROR_CHARS:,} more characters)"
            _finish(factory, firing_id, ok=False, errors=errors)
            log.warning("schedule %s: firing %s failed:\n%s", sc.name, fire_time.strftime(STAMP), errors)
            return FiringResult(sc.name, fire_time, run_name, False, None, errors, resumed)
        run_id, pending = submitted.run_id, submitted.pending_units
    if pending:
        import jobs.work.app  # noqa: F401 - binds the tasks to the configured broker
        from jobs.work.tasks import send_tickets

        send_tickets(pending)
    _finish(factory, firing_id, ok=True, run_id=run_id)
    return FiringResult(sc.name, fire_time, run_name, True, run_id, None, resumed)


def _finish(factory: queries.Factory, firing_id: int, **outcome) -> None:
    # Only while in progress: when a slow firing and its taker both finish, the first outcome stands.
    with factory.begin() as s:
        s.execute(update(Firing).where(Firing.id == firing_id, Firing.ok == false(), Firing.errors.is_(None))
                  .values(**outcome))


def _load(settings: Settings, manifest: str, run_name: str) -> RunSpec:
    """Read and check the manifest as `submit` does, under the firing's run name."""
    def load(path: Path) -> RunSpec:
        return load_manifest(path, registry=settings.registry(), name=run_name,
                             allowed_outputs=settings.allowed_outputs)

    if not manifest.startswith("s3://"):
        return load(Path(manifest))
    bucket, key = _s3_parts(manifest)
    with tempfile.TemporaryDirectory(prefix="reelbatch-schedule-") as folder:
        path = Path(folder) / PurePosixPath(key).name  # the same name, so the same suffix rules
        with _s3(manifest) as client:
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            # One byte past the limit is enough for load_manifest to refuse an oversized object by its size.
            path.write_bytes(body.read(MAX_FILE_BYTES + 1))
            body.close()
        try:
            spec = load(path)
        except ManifestError as exc:  # name the object, not the temporary file
            raise ManifestError([replace(issue, file=manifest) for issue in exc.issues]) from None
    return replace(spec, source=manifest)


def _submit(factory: queries.Factory, settings: Settings, spec: RunSpec) -> queries.Submitted:

    output = absolute_output(spec.output or settings.output)
    try:
        return queries.submit_run(factory, spec, output=output)
    except IntegrityError:
        # PostgreSQL: a taker of the same firing inserted the run between our check and our insert. Now the
        # name exists, so this returns that run (same content), or refuses it (RunNameTaken, content changed).
        return queries.submit_run(factory, spec, output=output)


def _utc(dt: datetime) -> datetime:
    # SQLite hands DateTime(timezone=True) back naive; every value we store is UTC.
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _s3_parts(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise UsageError(f"manifest {uri!r}: use s3://BUCKET/KEY, naming one object")
    return bucket, key


@contextmanager
def _s3(uri: str) -> Iterator:
    """A boto3 S3 client (endpoint and credentials from boto3's own configuration, as for outputs) whose errors
    become UsageErrors naming the manifest."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    # Checksums only where an API requires them, as in storage/s3.py: some S3-compatible servers mangle them.
    config = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required")
    try:
        yield boto3.session.Session().client("s3", config=config)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        if status == 404:
            raise UsageError(f"manifest {uri}: no such object (S3 answered 404 {code})") from None
        hint = " (without s3:ListBucket a missing object reads as 403)" if status == 403 else ""
        raise UsageError(f"manifest {uri}: S3 answered {status} {code}{hint}") from None
    except BotoCoreError as exc:  # no credentials, endpoint unreachable, ...
        raise UsageError(f"manifest {uri}: {exc}") from None
