"""A run's `checks` in a manifest: what a video whose checks fail (engine.frames.video_checks) becomes, from the file's
`checks: {on_fail: flag|retry|fail}` or from `--set checks.on_fail=VALUE`.

- flag (the default): the video is stored and marked flagged, with its checks;
- retry: it is rendered again once with the next seed (jobs.render.checks.next_seed), both attempts recorded and
  charged; if the second fails too it is stored and flagged;
- fail: the video fails with the checks' reason, and is not retried.
"""

from __future__ import annotations

from jobs.manifest.values import INVALID, FieldError, Map, shown
from jobs.manifest.yaml_read import yaml_scalar

ON_FAIL = ("flag", "retry", "fail")
DEFAULT_ON_FAIL = "flag"
SET_KEY = "checks.on_fail"  # `--set checks.on_fail=retry` (jobs.manifest.fields.SET_RUN_FIELDS)
CHECKS_FIELDS = ("on_fail",)


def check_on_fail(value: object, text: str | None) -> str:
    if not isinstance(value, str) or value not in ON_FAIL:
        raise FieldError(f"must be one of {', '.join(ON_FAIL)}, got {shown(value, text)}")
    return value


def pick_on_fail(top: Map, report, run_sets: dict[str, str]) -> str | object:
    """The run's `checks.on_fail`: from `--set` if given there, else from the file's `checks` mapping, else the
    default; INVALID when reported (each problem with its line, field and value)."""
    if SET_KEY in run_sets:
        entry = run_sets[SET_KEY]
        try:
            value, text = yaml_scalar(entry.partition("=")[2])
            return check_on_fail(value, text)
        except FieldError as exc:
            report(0, "--set", f"{entry!r}: {exc}")
            return INVALID
    item = top.items.get("checks")
    if item is None or item.value is None:
        return DEFAULT_ON_FAIL
    if item.value is INVALID:
        return INVALID
    if not isinstance(item.value, Map):
        report(item.line, "checks", f"must be a mapping such as {{on_fail: flag}}, got {shown(item.value, item.text)}")
        return INVALID
    found: str | object = DEFAULT_ON_FAIL
    for key, it in item.value.items.items():
        if key not in CHECKS_FIELDS:
            report(it.line, f"checks.{key}", f"unknown field {key!r} (checks has: {', '.join(CHECKS_FIELDS)})")
            found = INVALID
        elif it.value is not INVALID:
            try:
                found = check_on_fail(it.value, it.text)
            except FieldError as exc:
                report(it.line, "checks.on_fail", str(exc))
                found = INVALID
        else:
            found = INVALID
    return found
