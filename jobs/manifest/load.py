"""The user's contract: a manifest file (YAML or JSONL) read into frozen specs, or one ManifestError listing every
problem with its file, line, field and value. Nothing is returned until the whole file has been checked.

Reading (bytes to text, YAML and JSON lines to values with lines) lives in jobs.manifest.read; field rules live in
jobs.manifest.fields; each video's fields over the defaults, jobs.manifest.videos. This module assembles and checks
the run around its videos.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from engine.models.registry import Registry
from jobs.errors import UsageError
from jobs.manifest.checks import DEFAULT_ON_FAIL, pick_on_fail
from jobs.manifest.fields import (
    RUN_FIELDS,
    VIDEO_FIELDS,
    check_codec,
    check_crf,
    check_model,
    check_name,
    check_notify,
    check_preset,
    check_priority,
    video_checks,
)
from jobs.manifest.images import ImageChecker, check_video_image
from jobs.manifest.limits import pick_deadline, pick_max_cost, pick_set, split_sets
from jobs.manifest.outputs import canonical_output, check_output, check_output_allowed
from jobs.manifest.policy import ManifestPolicy
from jobs.manifest.read import load_jsonl, read_text
from jobs.manifest.room import check_room
from jobs.manifest.specs import Report, RunSpec
from jobs.manifest.values import INVALID, MAX_VIDEOS, FieldError, Item, Map, Seq, shown
from jobs.manifest.videos import check_default_frames, read_defaults, read_video, unknown_field
from jobs.manifest.yaml_read import load_yaml
from storage.codecs import DEFAULT, Encoding, unsafe_size


def load_manifest(
    path: str | os.PathLike,
    *,
    registry: Registry,
    name: str | None = None,
    model: str | None = None,
    output: str | None = None,
    priority: int | None = None,
    notify: str | None = None,
    sets: Sequence[str] = (),
    policy: ManifestPolicy = ManifestPolicy(),
    now: datetime | None = None,
    folder: str | None = None,
) -> RunSpec:
    """Read and check a whole manifest; raise ManifestError listing every problem, or return the run.

    `.yaml`/`.yml`: a run (name, model, output, priority, notify, codec, crf, preset, max_cost_usd, deadline, checks,
    defaults, videos). `.jsonl`: one
    video a line; the run's name (default: the file's stem), model, output, priority and notify come from the keyword
    arguments. For YAML the
    keyword arguments, when given, override the file's values (the file's own value is then not checked), and each
    `sets` entry (`FIELD=VALUE`, VALUE read as a YAML scalar) overrides that field of `defaults`. A video field comes
    from the video, else `defaults`, else the model's defaults; a `sets` entry naming a run field of SET_RUN_FIELDS
    (`priority`, `codec`, `crf`, `preset`, `max_cost_usd`, `deadline`, `checks.on_fail`) sets that run field instead,
    over the file's value (the `priority` keyword, when given, wins over both). `policy` (jobs.manifest.policy;
    every command passes Settings.manifest): the URI prefixes `output` must be under, the URL prefixes `notify` must
    be under (none: `notify` is refused), the prefixes an image outside the manifest's folder must be under, and
    the default output. `now` (aware; default the clock): what a deadline must be after, and what a deadline
    duration counts from. `folder`: where relative image paths are (default the manifest file's folder; a
    schedule's S3 manifest passes its s3:// prefix).

    The run's output is held in its canonical form (jobs.manifest.outputs): the manifest's own, else the policy's
    default output (None when neither is given); the run name and every id must fit the store there.
    """
    allowed_outputs, allowed_webhooks = policy.allowed_outputs, policy.allowed_webhooks
    allowed_inputs, default_output = policy.allowed_inputs, policy.default_output
    path = Path(path)
    report = Report(str(path))
    allowed = None if allowed_outputs is None else [_canonical("allowed output prefix", a) for a in allowed_outputs]
    fallback = None if default_output is None else _canonical("default output", default_output)
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".jsonl"):
        report(0, "(file)",
               f"{path.name!r} is not a manifest name: use .yaml or .yml (a run) or .jsonl (a video a line)")
        report.raise_any()
    text = read_text(path, report)
    if text is None:
        report.raise_any()
    if suffix == ".jsonl":
        top, entries = Map(0, {}), [(item, "") for item in load_jsonl(text, report)]
        if not entries and not report.issues:
            report(1, "(file)", "has no videos: write one JSON object a line")
        if name is None:
            name = _stem_name(path, report)
    else:
        top = load_yaml(text, report)
        if top is None:
            report.raise_any()
        entries = _yaml_videos(top, report)
    hooks = tuple(allowed_webhooks) if allowed_webhooks else None
    now = datetime.now(timezone.utc) if now is None else now.astimezone(timezone.utc)
    images = ImageChecker(folder if folder is not None else path.absolute().parent, allowed_inputs)
    spec = _assemble(top, entries, report, registry, path, allowed, fallback, name, model, output, priority, notify,
                     hooks, sets, now, images)
    report.raise_any()
    return spec


# --- Assembly: run fields, defaults, videos -----------------------------------------------------------------------


def _assemble(top, entries, report, registry, path, allowed, fallback, name, model, output, priority, notify, hooks,
              sets, now, images) -> RunSpec | None:
    run_name = _pick(top, report, "name", name, check_name, required=True)
    model_name = _pick(top, report, "model", model, partial(check_model, names=registry.names()), default="tiny")
    out = _pick(top, report, "output", output, check_output, default=None)
    if allowed is not None and out not in (None, INVALID):
        line, field, written = (0, "--output", output) if output is not None else \
            (top.items["output"].line, "output", top.items["output"].value)
        try:
            check_output_allowed(written, out, allowed)
        except FieldError as exc:
            report(line, field, str(exc))
    run_sets, sets = split_sets(sets)
    if priority is not None:  # the keyword (a caller's own priority) wins over `--set priority=`
        prio = _pick(top, report, "priority", priority, check_priority, default=0)
    else:
        prio = pick_set(top, report, "priority", run_sets, check_priority, default=0)
    hook = _pick(top, report, "notify", notify, partial(check_notify, allowed=hooks), default=None)
    codec = pick_set(top, report, "codec", run_sets, check_codec, default=DEFAULT.codec)
    crf = pick_set(top, report, "crf", run_sets, check_crf, default=DEFAULT.crf)
    preset = pick_set(top, report, "preset", run_sets, check_preset, default=DEFAULT.preset)
    cap = pick_max_cost(top, report, run_sets)
    deadline, deadline_form = pick_deadline(top, report, run_sets, now)
    on_fail = pick_on_fail(top, report, run_sets)
    for key, item in top.items.items():
        if key not in RUN_FIELDS:
            hint = " (video fields go in each video or under 'defaults')" if key in VIDEO_FIELDS else ""
            report(item.line, key, unknown_field(key, RUN_FIELDS) + hint)
    info = registry.models[model_name] if model_name is not INVALID else None
    checks = video_checks(info, images)
    defaults = read_defaults(top, sets, report, checks)
    defaults_too_long = check_default_frames(defaults, info, report)
    seen: dict[str, tuple[int, str]] = {}
    videos = []
    takers = [n for n in registry.names() if registry.models[n].image_condition]
    for item, prefix in entries:
        video = read_video(item, prefix, defaults, checks, info, seen, defaults_too_long, report)
        if video is None or not check_video_image(item.value, prefix, defaults, video, info, takers, report):
            continue
        if codec is not INVALID and (unsafe := unsafe_size(codec, video.width, video.height)) is not None:
            report(video.line, prefix + "resolution", f"{unsafe}; use h264 or another size")
        else:
            videos.append(video)
    if report.issues:
        return None
    where = fallback if out is None else out
    if where is not None:
        name_at = (0, "--name") if name is not None else (top.items["name"].line, "name")
        output_at = ((0, "--output") if output is not None else (top.items["output"].line, "output") if out
                     else (0, "REELBATCH_OUTPUT"))
        check_room(where, output_at, run_name, name_at, videos, seen, report)
        if report.issues:
            return None
    # The hash has the file's own output (None when it names none), so filling in the default changes no hash;
    # submit_run adds the output the run is recorded with.
    encoding = Encoding(codec, crf, preset)
    return RunSpec(run_name, model_name, where, prio, str(path.absolute()), tuple(videos),
                   _content_sha256(run_name, model_name, out, prio, videos, hook, encoding, cap, deadline_form, on_fail),
                   hook, encoding, cap, deadline, separate_image_batches=not info.mixed_image_batches, on_fail=on_fail)


def _pick(top: Map, report, key, override, check, *, required=False, default=None):
    """A run field from its keyword argument if given, else from the file, else its default; checked either way."""
    if override is not None:
        line, field, value, text = 0, f"--{key}", override, None
    elif key in top.items:
        item = top.items[key]
        line, field, value, text = item.line, key, item.value, item.text
    elif required:
        report(top.line, key, f"missing required field {key!r}")
        return INVALID
    else:
        line, field, value, text = top.line, key, default, None
    if value is INVALID:
        return INVALID
    try:
        return check(value, text)
    except FieldError as exc:
        report(line, field, str(exc))
        return INVALID


def _yaml_videos(top: Map, report) -> list[tuple[Item, str]]:
    item = top.items.get("videos")
    if item is None:
        report(top.line, "videos", "missing required field 'videos' (a list of videos, each with id and prompt)")
        return []
    if item.value is INVALID:
        return []
    if item.value is None or (isinstance(item.value, Seq) and not item.value.items):
        report(item.line, "videos", f"is empty ({shown(item.value, item.text)}): list at least one video")
        return []
    if not isinstance(item.value, Seq):
        report(item.line, "videos", f"must be a list (start each video with '- '), got {shown(item.value, item.text)}")
        return []
    if len(item.value.items) > MAX_VIDEOS:
        report(item.line, "videos", f"has {len(item.value.items):,} videos, over the {MAX_VIDEOS:,} limit; "
                                    "split it into several runs")
        return []
    return [(it, f"videos[{i}].") for i, it in enumerate(item.value.items)]


def _stem_name(path: Path, report) -> str | object:
    try:
        return check_name(path.stem, None)
    except FieldError as exc:
        report(0, "name", f"the file's stem {path.stem!r} cannot be the run name: {exc}; pass a name (--name)")
        return INVALID


def _canonical(what: str, uri: str) -> str:
    try:
        return canonical_output(uri)
    except FieldError as exc:
        raise UsageError(f"{what} {uri!r} {exc}") from None


_IMAGE_FIELDS = ("image", "image_sha256", "fit")


def _content_sha256(name, model, output, priority, videos, notify, encoding, max_cost_usd, deadline,
                    on_fail=DEFAULT_ON_FAIL) -> str:
    # Lines are left out with `source`: the same videos written as YAML or as JSONL are the same run; and a text-only
    # video's image fields, so a manifest without images keeps the hash it had before they existed.
    doc = {"name": name, "model": model, "output": output, "priority": priority,
           "videos": [{k: v for k, v in vars(video).items() if k != "line" and not (k in _IMAGE_FIELDS and v is None)}
                      for video in videos]}
    # Only when set, so a manifest that names none of these keeps the hash (and so the run) it had before they
    # existed.
    if notify is not None:
        doc["notify"] = notify
    if encoding != DEFAULT:
        doc["encoding"] = vars(encoding)
    if max_cost_usd is not None:
        doc["max_cost_usd"] = max_cost_usd
    if deadline is not None:
        doc["deadline"] = deadline
    if on_fail != DEFAULT_ON_FAIL:
        doc["checks"] = {"on_fail": on_fail}
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
