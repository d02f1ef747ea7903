"""A manifest's videos, field by field: each video's own fields over the run's `defaults` (and `--set`) over the
model's defaults, every problem reported with its line and field. jobs.manifest.load assembles the run around them.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from engine.models.registry import ModelInfo
from jobs.manifest.fields import OPTION_RUN_FIELDS, SET_RUN_FIELDS, VIDEO_FIELDS
from jobs.manifest.model_shape import plan_frames, side_problem
from jobs.manifest.specs import VideoSpec
from jobs.manifest.values import INVALID, FieldError, Item, Map, shown
from jobs.manifest.yaml_read import yaml_scalar


def read_defaults(top: Map, sets: Sequence[str], report, checks) -> dict[str, tuple[object, int, str]]:
    """Field -> (checked value or INVALID, line, field path) from `defaults`, then `sets` over them."""
    out: dict[str, tuple[object, int, str]] = {}
    item = top.items.get("defaults")
    if item is not None and item.value is not None and item.value is not INVALID:
        if not isinstance(item.value, Map):
            report(item.line, "defaults", f"must be a mapping of video fields, got {shown(item.value)}")
        else:
            for key, it in item.value.items.items():
                value = check_default(key, it.value, it.text, checks)
                if isinstance(value, FieldError):
                    report(it.line, f"defaults.{key}", str(value))
                    value = INVALID
                out[key] = (value, it.line, f"defaults.{key}")
    for entry in sets:
        if not isinstance(entry, str) or "=" not in entry:
            report(0, "--set", f"must be FIELD=VALUE, got {shown(entry)}")
            continue
        key, _, raw = entry.partition("=")
        key = key.strip()
        try:
            value, text = yaml_scalar(raw)
        except FieldError as exc:
            value = exc
        else:
            value = _set_default(key, value, text, checks)
        if isinstance(value, FieldError):
            report(0, "--set", f"{entry!r}: {value}")
            value = INVALID
        out[key] = (value, 0, "--set")
    return out


def _set_default(key: str, value, text, checks):
    """A `--set` entry that is no run field of SET_RUN_FIELDS: a video default, checked as `defaults` is."""
    if key in OPTION_RUN_FIELDS:
        return FieldError(f"{key} is a run field with an option of its own: use --{key}")
    if key not in checks:
        return FieldError(unknown_field(key, VIDEO_FIELDS + SET_RUN_FIELDS))
    return check_default(key, value, text, checks)


def check_default(key: str, value, text, checks):
    """The checked value, or the FieldError to report."""
    if key == "id":
        return FieldError(f"an id cannot have a default ({shown(value, text)}): give each video its own")
    if key not in checks:
        return FieldError(unknown_field(key, VIDEO_FIELDS))
    if value is INVALID:
        return INVALID  # already reported where it was read
    try:
        return checks[key](value, text)
    except FieldError as exc:
        return exc


def check_default_frames(defaults, info: ModelInfo | None, report) -> bool:
    """Report once, at `defaults`, a default duration and fps too long for the model; True if they are."""
    given = [defaults[k] for k in ("duration_s", "fps") if k in defaults]
    if info is None or not given or any(v is INVALID for v, _, _ in given):
        return False
    duration = defaults.get("duration_s", (info.defaults.duration_s,))[0]
    fps = defaults.get("fps", (info.defaults.fps,))[0]
    try:
        plan_frames(info, duration, fps)
    except FieldError as exc:
        _, line, field = given[0]
        report(line, field, str(exc))
        return True
    return False


def read_video(item: Item, prefix: str, defaults, checks, info, seen, defaults_too_long, report) -> VideoSpec | None:
    """One video: its own fields over `defaults` over the model's; None if anything was reported."""
    vmap = item.value
    if vmap is INVALID:
        return None
    if not isinstance(vmap, Map):
        field = prefix[:-1] if prefix else "(video)"
        report(item.line, field, f"each video must be a mapping with id and prompt, got {shown(vmap, item.text)}")
        return None
    # A video reused through an alias (`- *base`) holds the anchor's values and lines: report it at its own line.
    via = "" if item.alias is None else f" (video *{item.alias}, written at line {vmap.line})"
    line = vmap.line if item.alias is None else item.line

    def at(it: Item) -> int:
        return it.line if item.alias is None else item.line

    ok, own = True, {}
    for key, it in vmap.items.items():
        if key not in checks:
            report(at(it), prefix + key, unknown_field(key, VIDEO_FIELDS) + via)
            ok = False
        elif it.value is INVALID:
            ok = False
        else:
            try:
                own[key] = checks[key](it.value, it.text)
            except FieldError as exc:
                report(at(it), prefix + key, str(exc) + via)
                ok = False
    for key in ("id", "prompt"):
        if key not in vmap.items and (key == "id" or key not in defaults):
            report(line, prefix + key, f"missing required field {key!r}{via}")
            ok = False
    if "id" in own:
        vid = own["id"]
        if vid in seen:
            first_line, first_prefix = seen[vid]
            where = f"line {first_line}" + (f" ({first_prefix[:-1]})" if first_prefix else "")
            report(at(vmap.items["id"]), prefix + "id", f"duplicate id {shown(vid)}: already used at {where}{via}")
            ok = False
        else:
            seen[vid] = (at(vmap.items["id"]), prefix)
    if info is None:
        return None
    d = info.defaults

    def get(key, fallback):
        if key in vmap.items:
            return own.get(key, INVALID)  # INVALID: reported above
        return defaults.get(key, (fallback,))[0]  # INVALID: reported at `defaults`

    size = get("resolution", (d.width, d.height))
    if "resolution" not in vmap.items and "resolution" not in defaults:
        # The model's own default size, checked as a manifest's (a models file's defaults are checked when it is
        # read, engine.models.shape_rules.check_registration; this holds for any registration).
        for side, n in (("width", d.width), ("height", d.height)):
            problem = side_problem(info, side, n)
            if problem is not None:
                report(line, prefix + "resolution", f"{side} {n} ({info.name}'s default {d.width}x{d.height}; "
                                                    f"the video sets none) {problem}{via}")
                size = INVALID
                break
    image, fit = get("image", None), get("fit", None)
    values = dict(prompt=get("prompt", None), negative_prompt=get("negative_prompt", None), seed=get("seed", None),
                  duration_s=get("duration_s", d.duration_s), fps=get("fps", d.fps), steps=get("steps", d.steps),
                  guidance=get("guidance", float(d.guidance)))
    frames = None
    own_timing = "duration_s" in vmap.items or "fps" in vmap.items
    # Checked even when another field is bad, so one pass over the file shows both problems.
    if INVALID not in (values["duration_s"], values["fps"]) and (own_timing or not defaults_too_long):
        try:
            frames = plan_frames(info, values["duration_s"], values["fps"])
        except FieldError as exc:
            where = vmap.items.get("duration_s") or vmap.items.get("fps")
            report(at(where) if where else line, prefix + "duration_s", str(exc) + via)
    if not ok or frames is None or size is INVALID or any(v is INVALID for v in (*values.values(), image, fit)):
        return None
    chunks = info.chunk_plan(frames).chunks if info else 1
    return VideoSpec(id=own["id"], line=line, prompt=values["prompt"], negative_prompt=values["negative_prompt"],
                     seed=values["seed"], width=size[0], height=size[1], frames=frames, fps=values["fps"],
                     duration_s=frames / values["fps"], steps=values["steps"], guidance=float(values["guidance"]),
                     requested_duration_s=float(values["duration_s"]), chunks=chunks,
                     window=info.max_frames if chunks > 1 else frames,
                     chunk_overlap=info.chunk_overlap if chunks > 1 else 0,
                     image=image.uri if image else None, image_sha256=image.sha256 if image else None,
                     fit=(fit or "crop") if image else None)


def unknown_field(key: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    return f"unknown field {shown(key)}" + (f" (did you mean {close[0]!r}?)" if close else "")
