"""Firing schedules (jobs.work.schedules defines them). Plain functions: `reelbatch beat` only decides when a worker
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
import tempfile
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from sqlalchemy import false, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from jobs.db import queries, submission
from jobs.db.base import as_utc, utcnow
from jobs.db.rows import Run
from jobs.db.service_rows import Firing, Schedule
from jobs.errors import UsageError
from jobs.manifest import ManifestError, RunSpec, load_manifest
from jobs.manifest.values import MAX_FILE_BYTES
from jobs.settings import Settings
from jobs.work.schedules import (
    MAX_ERROR_CHARS,
    RESUME_AFTER,
    STAMP,
    FiringResult,
    due_fire_time,
    run_name_for,
    s3_client,
    s3_parts,
)

log = logging.getLogger(__name__)


def fire_due(factory: queries.Factory, settings: Settings, now: datetime,
             send_tickets: Callable[[int, str], object]) -> list[FiringResult]:
    """Fire every schedule whose latest fire time at or before `now` (aware) is after its creation and not yet fired,
    and finish firings another process left in progress for RESUME_AFTER. Returns the firings this call made or
    finished; a firing another caller already has is skipped. A bad or unreadable manifest is a failed firing
    (`ok` false, `errors`), never an exception; an unexpected error is logged and its firing finished later.
    `send_tickets(n, model)` queues a made run's tickets on its model's queue.
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
        taken.setdefault(schedule_id, []).append((firing_id, as_utc(fire_time), True))
    results = []
    for sc in schedules:
        claimed = []
        due = due_fire_time(sc.cron, sc.created_at, now)
        # Only later than the last firing: a beat whose clock lags another's never fires an older slot.
        if due is not None and (sc.id not in last or due > as_utc(last[sc.id])):
            firing_id = _claim(factory, sc.id, due)
            if firing_id is not None:
                claimed.append((firing_id, due, False))
        claimed += taken.get(sc.id, [])
        for firing_id, fire_time, resumed in claimed:
            try:
                results.append(_complete(factory, settings, sc, firing_id, fire_time, resumed, send_tickets))
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


def _complete(factory, settings: Settings, sc: Schedule, firing_id: int, fire_time: datetime, resumed: bool,
              send_tickets: Callable[[int, str], object]) -> FiringResult:
    run_name = run_name_for(sc.name, fire_time)
    run_id = None
    if resumed:
        with factory() as s:
            run_id = s.scalar(select(Run.id).where(Run.name == run_name))
    if run_id is not None:  # the process that died had made the run: adopt it
        pending = queries.pending_unit_count(factory, run_name)
        with factory() as s:
            model = s.scalar(select(Run.model).where(Run.id == run_id))
    else:
        try:
            submitted = _submit(factory, settings, _load(settings, sc.manifest, run_name, sc.notify_url))
        except UsageError as exc:  # a bad or unreadable manifest, or the run name taken by other content
            errors = str(exc)
            if len(errors) > MAX_ERROR_CHARS:
                errors = f"{errors[:MAX_ERROR_CHARS]}\n... ({len(errors) - MAX_ERROR_CHARS:,} more characters)"
            _finish(factory, firing_id, ok=False, errors=errors)
            log.warning("schedule %s: firing %s failed:\n%s", sc.name, fire_time.strftime(STAMP), errors)
            return FiringResult(sc.name, fire_time, run_name, False, None, errors, resumed)
        run_id, pending, model = submitted.run_id, submitted.pending_units, submitted.model
    if pending:
        send_tickets(pending, model)
    _finish(factory, firing_id, ok=True, run_id=run_id)
    return FiringResult(sc.name, fire_time, run_name, True, run_id, None, resumed)


def _finish(factory: queries.Factory, firing_id: int, **outcome) -> None:
    # Only while in progress: when a slow firing and its taker both finish, the first outcome stands.
    with factory.begin() as s:
        s.execute(update(Firing).where(Firing.id == firing_id, Firing.ok == false(), Firing.errors.is_(None))
                  .values(**outcome))


def _load(settings: Settings, manifest: str, run_name: str, notify: str | None) -> RunSpec:
    """Read and check the manifest as `submit` does, under the firing's run name (and the schedule's webhook)."""
    def load(path: Path, folder: str | None = None) -> RunSpec:
        return load_manifest(path, registry=settings.registry(), name=run_name, notify=notify,
                             policy=settings.manifest, folder=folder)

    if not manifest.startswith("s3://"):
        return load(Path(manifest))
    bucket, key = s3_parts(manifest)
    with tempfile.TemporaryDirectory(prefix="reelbatch-schedule-") as folder:
        path = Path(folder) / PurePosixPath(key).name  # the same name, so the same suffix rules
        with s3_client(manifest) as client:
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            # One byte past the limit is enough for load_manifest to refuse an oversized object by its size.
            path.write_bytes(body.read(MAX_FILE_BYTES + 1))
            body.close()
        try:
            # Relative image paths are beside the manifest's object, not in this temporary folder.
            parent = PurePosixPath(key).parent.as_posix()
            spec = load(path, folder=f"s3://{bucket}/" if parent == "." else f"s3://{bucket}/{parent}/")
        except ManifestError as exc:  # name the object, not the temporary file
            raise ManifestError([replace(issue, file=manifest) for issue in exc.issues]) from None
    return replace(spec, source=manifest)


def _submit(factory: queries.Factory, settings: Settings, spec: RunSpec) -> submission.Submitted:
    output = spec.output  # canonical: the manifest's own, else REELBATCH_OUTPUT's (load_manifest)
    try:
        return submission.submit_run(factory, spec, output=output)
    except IntegrityError:
        # PostgreSQL: a taker of the same firing inserted the run between our check and our insert. Now the
        # name exists, so this returns that run (same content), or refuses it (RunNameTaken, content changed).
        return submission.submit_run(factory, spec, output=output)


