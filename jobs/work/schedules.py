"""Schedules: a manifest submitted on a cron schedule (jobs.work.firing fires them). Adding one checks everything it
can: the name (it becomes part of every run's name), the cron (UTC; one that never fires is refused) and the
manifest (a local file or an S3 object that must exist).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import PurePosixPath

from botocore.exceptions import BotoCoreError, ClientError
from croniter import CroniterBadDateError, CroniterError, croniter
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from jobs.db import queries
from jobs.db.base import as_utc, utcnow
from jobs.db.service_rows import Firing, Schedule
from jobs.errors import UsageError
from jobs.manifest.fields import MAX_NAME_CHARS, check_name, check_notify
from jobs.manifest.values import FieldError
from jobs.settings import Settings
from storage import s3
from storage.base import utf8_len
from storage.local import NAME_MAX

STAMP = "%Y%m%dT%H%M%SZ"
# A run name is `{schedule}-{stamp}` and must fit the 128 characters of a run name, and a folder name's 255 bytes (a
# run's videos go in a folder of its name in a local store; the firing checks the whole key against its own output).
MAX_SCHEDULE_NAME = MAX_NAME_CHARS - len("-") - len("20260101T020000Z")
MAX_SCHEDULE_BYTES = NAME_MAX - len("-") - len("20260101T020000Z")
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
    notify: str | None = None  # each run's webhook, over the manifest's `notify`


def run_name_for(schedule: str, fire_time: datetime) -> str:
    return f"{schedule}-{fire_time.astimezone(timezone.utc).strftime(STAMP)}"


def due_fire_time(cron: str, created_at: datetime, now: datetime) -> datetime | None:
    """The latest fire time at or before `now`, if it is after `created_at`; else None."""
    # croniter's get_prev is strictly before its start; crons have whole-second resolution, so start 1 s past now.
    latest = croniter(cron, now.replace(microsecond=0) + timedelta(seconds=1)).get_prev(datetime).replace(fold=0)
    return latest if latest > as_utc(created_at) else None


def add_schedule(factory: queries.Factory, name: str, manifest: str, cron: str, *, notify: str | None = None,
                 settings: Settings | None = None) -> ScheduleInfo:
    """`notify`: a webhook URL checked as a manifest's is, against `settings` (REELBATCH_ALLOWED_WEBHOOKS)."""
    name, cron, manifest = _check_name(name), check_cron(cron), check_manifest(manifest)
    if notify is not None:
        notify = _check_notify(notify, settings)
    try:
        with factory.begin() as s:
            if s.scalar(select(Schedule.id).where(Schedule.name == name)) is None:
                s.add(Schedule(name=name, manifest=manifest, cron=cron, notify_url=notify))
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
    return [ScheduleInfo(sc.name, sc.manifest, sc.cron, as_utc(sc.created_at),
                         croniter(sc.cron, max(now, as_utc(sc.created_at))).get_next(datetime).replace(fold=0),
                         None if f is None else FiringResult(sc.name, as_utc(f.fire_time),
                                                             run_name_for(sc.name, f.fire_time), f.ok, f.run_id,
                                                             f.errors), sc.notify_url)
            for sc, f in s.execute(query).all()]


def _check_name(name: str) -> str:
    try:
        name = check_name(name, None)  # the run name rule: the name becomes part of every run's name
    except FieldError as exc:
        raise UsageError(f"schedule name {name!r}: {exc}") from None
    if len(name) > MAX_SCHEDULE_NAME:
        raise UsageError(f"schedule name {name!r} is {len(name)} characters; at most {MAX_SCHEDULE_NAME}, so that "
                         f"NAME-YYYYmmddTHHMMSSZ fits the {MAX_NAME_CHARS} characters of a run name")
    if utf8_len(name) > MAX_SCHEDULE_BYTES:
        raise UsageError(f"schedule name {name!r} is {utf8_len(name)} bytes in UTF-8; at most {MAX_SCHEDULE_BYTES}, "
                         f"so that NAME-YYYYmmddTHHMMSSZ fits the {NAME_MAX} bytes of a folder name")
    return name


def _check_notify(url: str, settings: Settings | None) -> str:
    if settings is not None and settings.webhooks.secret is None:
        raise UsageError(f"--notify {url!r}: REELBATCH_WEBHOOK_SECRET is not set, so its deliveries could not be "
                         "signed; set it here and on every worker")
    try:
        return check_notify(url, None, settings.manifest.allowed_webhooks if settings else None)
    except FieldError as exc:
        raise UsageError(f"--notify: {exc}") from None


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
    s3 = s3_parts(manifest) if manifest.startswith("s3://") else None
    if s3 is None and "://" in manifest:
        raise UsageError(f"manifest {manifest!r}: give a file path or an s3://BUCKET/KEY URI")
    if PurePosixPath(s3[1] if s3 else manifest).suffix.lower() not in (".yaml", ".yml", ".jsonl"):
        raise UsageError(f"manifest {manifest!r} is not a manifest name: use .yaml or .yml (a run) or .jsonl")
    if s3:
        with s3_client(manifest) as client:
            client.head_object(Bucket=s3[0], Key=s3[1])
        return manifest
    path = os.path.abspath(manifest)  # abspath, not resolve(), as for outputs: the path stays as written
    if not os.path.isfile(path):
        raise UsageError(f"manifest {path!r} is not a file" if os.path.exists(path) else f"no file {path!r}")
    if not os.access(path, os.R_OK):
        raise UsageError(f"manifest {path!r} cannot be read (permissions)")
    return path


def s3_parts(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise UsageError(f"manifest {uri!r}: use s3://BUCKET/KEY, naming one object")
    return bucket, key


@contextmanager
def s3_client(uri: str) -> Iterator:
    """A boto3 S3 client (endpoint and credentials from boto3's own configuration, as for outputs) whose errors
    become UsageErrors naming the manifest."""
    try:
        yield s3.client()
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        if status == 404:
            raise UsageError(f"manifest {uri}: no such object (S3 answered 404 {code})") from None
        hint = " (without s3:ListBucket a missing object reads as 403)" if status == 403 else ""
        raise UsageError(f"manifest {uri}: S3 answered {status} {code}{hint}") from None
    except BotoCoreError as exc:  # no credentials, endpoint unreachable, ...
        raise UsageError(f"manifest {uri}: {exc}") from None
