"""Old runs removed: the rows of every finished run (all its videos succeeded, failed or cancelled) whose last video
ended more than an age ago, and with `objects`, its MP4s, posters and result files in its store. A run with videos
pending or running is kept, and said why. The cost ledger keeps what the removed runs were charged (jobs.db.prune).
What `reelbatch prune` does."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from jobs.db import prune as rows
from jobs.db.base import utcnow
from jobs.errors import UsageError
from jobs.manifest.keys import object_key, poster_key, result_keys
from jobs.settings import Settings
from jobs.usecases.database import read_factory
from storage.stores import StoreError, open_store

_AGE = re.compile(r"(\d+)([dhm])")
_UNIT_S = {"d": 86_400, "h": 3_600, "m": 60}


def parse_age(raw: str) -> timedelta:
    """`30d`, `12h`, `90m`: a whole number of days, hours or minutes."""
    found = _AGE.fullmatch(raw.strip())
    if not found:
        raise UsageError(f"--older-than: {raw!r} is not an age: use a whole number and d, h or m (30d, 12h, 90m)")
    return timedelta(seconds=int(found[1]) * _UNIT_S[found[2]])


@dataclass(frozen=True)
class Removed:
    """A run removed (or, in a dry run, that would be): when it ended, its videos, and its objects deleted (None:
    objects were not asked for)."""

    run_id: int
    name: str
    ended_at: str | None
    videos: int
    objects: int | None


@dataclass(frozen=True)
class Kept:
    run_id: int
    name: str
    why: str  # "2 pending, 1 running"


@dataclass(frozen=True)
class Pruned:
    older_than_s: int
    dry_run: bool
    removed: list[Removed] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)  # unfinished runs
    recent: int = 0  # finished runs that ended within the age


def prune(settings: Settings, older_than: timedelta, objects: bool = False, dry_run: bool = False,
          now: datetime | None = None) -> Pruned:
    """Remove what `reelbatch prune` removes (nothing when `dry_run`); returns what was (or would be) removed and
    what was kept. UsageError, naming the run and its output, when a store cannot delete an object: the run's rows
    are gone by then, and a second prune cannot find its objects, so the message lists what is left."""
    factory = read_factory(settings)
    cutoff = (now or utcnow()) - older_than
    ages = rows.run_ages(factory)
    kept = [Kept(a.run_id, a.name, ", ".join(f"{a.counts[st]} {st}" for st in ("pending", "running")
                                             if a.counts.get(st))) for a in ages if not a.finished]
    finished = [a for a in ages if a.finished]
    due = [a for a in finished if a.ended_at is None or a.ended_at < cutoff]
    recent = len(finished) - len(due)
    stored = {a.run_id: rows.stored_videos(factory, a.run_id) for a in due}
    if not dry_run:
        gone = set(rows.remove_runs(factory, [a.run_id for a in due]))
        # Resumed since it was read: kept whole, and not listed as removed.
        kept += [Kept(a.run_id, a.name, "resumed while pruning") for a in due if a.run_id not in gone]
        due = [a for a in due if a.run_id in gone]
    removed = []
    for a in due:
        keys = _keys(a.name, stored[a.run_id]) if objects else None
        if keys is not None and not dry_run:
            _delete(a, keys)
        removed.append(Removed(a.run_id, a.name, a.ended_at.isoformat() if a.ended_at else None,
                               len(stored[a.run_id]), None if keys is None else len(keys)))
    return Pruned(int(older_than.total_seconds()), dry_run, removed, kept, recent)


def _keys(name: str, videos: list[rows.Stored]) -> list[str]:
    """The run's objects: each stored video's MP4 and poster, and its result files (written when it ended)."""
    keys = [object_key(name, v.key) for v in videos if v.mp4] + [poster_key(name, v.key) for v in videos if v.poster]
    return keys + list(result_keys(name))


def _delete(run: rows.RunAge, keys: list[str]) -> None:
    done = 0
    try:
        store = open_store(run.output)
        for key in keys:
            store.delete(key)  # nothing if there is none
            done += 1
    except (ValueError, StoreError) as exc:
        raise UsageError(f"run {run.name}: its rows are removed, but {len(keys) - done} of its {len(keys)} objects "
                         f"are left in its output {run.output}: {exc}; check the store (for S3, AWS_ENDPOINT_URL "
                         "and the credentials) and delete them there") from None
