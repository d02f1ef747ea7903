"""A run's limits in a manifest: its cost cap (`max_cost_usd`) and its deadline, from the file or from `--set`.

A deadline is a moment (checked to be ahead of the time the manifest is loaded) or a duration counted from then.
jobs.manifest.load calls these while it assembles the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from jobs.manifest.fields import SET_RUN_FIELDS, check_deadline, check_max_cost
from jobs.manifest.values import INVALID, FieldError, Map
from jobs.manifest.yaml_read import yaml_scalar


def split_sets(sets: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """`--set` entries for run fields (SET_RUN_FIELDS: the last of each wins), and the rest (video defaults)."""
    run_sets: dict[str, str] = {}
    rest = []
    for entry in sets:
        key = entry.partition("=")[0].strip() if isinstance(entry, str) and "=" in entry else None
        if key in SET_RUN_FIELDS:
            run_sets[key] = entry
        else:
            rest.append(entry)
    return run_sets, rest


def _pick(top: Map, report, key: str, run_sets: dict[str, str], check) -> tuple[object, int, str]:
    """An optional run field from `--set` if given there, else from the file: (checked value, None when absent, or
    INVALID when reported; its line; its field as messages name it)."""
    if key in run_sets:
        entry = run_sets[key]
        try:
            value, text = yaml_scalar(entry.partition("=")[2])
            return check(value, text), 0, "--set"
        except FieldError as exc:
            report(0, "--set", f"{entry!r}: {exc}")
            return INVALID, 0, "--set"
    item = top.items.get(key)
    if item is None:
        return None, top.line, key
    if item.value is INVALID:
        return INVALID, item.line, key
    try:
        return check(item.value, item.text), item.line, key
    except FieldError as exc:
        report(item.line, key, str(exc))
        return INVALID, item.line, key


def pick_set(top: Map, report, key: str, run_sets: dict[str, str], check, default):
    """A run field from `--set` if given there (it wins over the file), else from the file, else `default`; checked
    as the file's value is, INVALID when reported."""
    value, _, _ = _pick(top, report, key, run_sets, check)
    return default if value is None else value


def pick_max_cost(top: Map, report, run_sets: dict[str, str]) -> float | None:
    """The run's cost cap in US dollars, or None (no cap, or reported)."""
    value, _, _ = _pick(top, report, "max_cost_usd", run_sets, check_max_cost)
    return None if value is INVALID else value


def pick_deadline(top: Map, report, run_sets: dict[str, str], now: datetime) -> tuple[datetime | None, str | None]:
    """The run's deadline in UTC (a duration counted from `now`) and the form its content hash takes: the moment,
    or the duration as written (so the same scheduled manifest submitted again is the same content)."""
    value, line, field = _pick(top, report, "deadline", run_sets, check_deadline)
    if value is None or value is INVALID:
        return None, None
    if isinstance(value, timedelta):
        return (now + value).replace(microsecond=0), f"+{int(value.total_seconds())}s"
    if value <= now:
        given = f"{run_sets['deadline']!r}: " if field == "--set" else ""
        report(line, field, f"{given}{utc_text(value)} is in the past (it is {utc_text(now)} now)")
        return None, None
    return value, utc_text(value)


def utc_text(moment: datetime) -> str:
    """An aware moment as ISO 8601 in UTC, to the second: 2026-12-02T08:00:00Z."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
