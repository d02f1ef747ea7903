"""What each manifest field may hold: one checker per field, returning the clean value or raising FieldError.

Checkers see a value as loaded from YAML or JSON plus, for a YAML scalar, its source text, so a message can show what
the user wrote (`001`, `.nan`, `yes`) rather than what the parser made of it (1, nan, True).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from engine.frames.images import FITS
from engine.models.registry import ModelInfo
from jobs.manifest.model_shape import side_problem
from jobs.manifest.scalars import is_number
from jobs.manifest.urls import BadUrl, check_allowed
from jobs.manifest.values import FieldError, got, shown
from storage.codecs import CODECS, CRF_MAX, CRF_MIN, DEFAULT, PRESETS, missing_encoder

MAX_PROMPT_CHARS = 10_000
MAX_NAME_CHARS = 128
MAX_SEED = 2**63 - 1  # signed 64-bit: a BIGINT column and torch.Generator.manual_seed both take it
MIN_SIDE, MAX_SIDE = 16, 2048
MAX_DURATION_S = 600.0
MAX_FPS = 60
MAX_STEPS = 200
MAX_GUIDANCE = 30.0
MAX_PRIORITY = 9
MAX_COST_USD = 100_000.0  # a run's cost cap; past this a typo (an extra zero or three) is likelier than a plan
MAX_DEADLINE_AHEAD = timedelta(days=366)
RESOLUTION_PRESETS = {"480p": (832, 480), "720p": (1280, 720)}

VIDEO_FIELDS = ("id", "prompt", "negative_prompt", "seed", "resolution", "duration_s", "fps", "steps", "guidance",
                "image", "fit")
RUN_FIELDS = ("name", "model", "output", "priority", "notify", "codec", "crf", "preset", "max_cost_usd",
              "deadline", "checks", "defaults", "videos")
# Run fields that `--set FIELD=VALUE` may give as well (every other `--set` is a video default): a JSONL manifest has
# no run fields of its own. name, model, output and notify have options of their own (OPTION_RUN_FIELDS);
# defaults and videos are the file's structure, not a value.
SET_RUN_FIELDS = ("priority", "codec", "crf", "preset", "max_cost_usd", "deadline", "checks.on_fail")
OPTION_RUN_FIELDS = ("name", "model", "output", "notify")

# --- Scalars --------------------------------------------------------------------------------------------------------


def _integer(value: object, text: str | None, lo: int, hi: int) -> int:
    # bool is an int in Python: `true` may not pass as 1.
    if type(value) is not int:
        raise FieldError(f"must be an integer from {lo} to {hi}, {got(value, text)}{_unquote_hint(value)}")
    if not lo <= value <= hi:
        raise FieldError(f"must be an integer from {lo} to {hi}, got {shown(value, text)}")
    return value


def _number(value: object, text: str | None, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"must be a number, {got(value, text)}{_unquote_hint(value)}")
    # Infinity written as such (.inf, Infinity) is refused for what it is; 1e400 is a finite number out of range.
    written_inf = text is not None and text.lstrip("+-").lower() in (".inf", "infinity")
    if math.isnan(value) or (math.isinf(value) and (written_inf or text is None)):
        raise FieldError(f"must be a finite number, got {shown(value, text)}")
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"more than {lo:g}" if lo_open else f"at least {lo:g}"
        raise FieldError(f"must be {bound} and at most {hi:g}, got {shown(value, text)}")
    return float(value)


def _unquote_hint(value: object) -> str:
    """For a string where a number belongs: say so when it would be one without its quotes."""
    return "; write it without quotes" if isinstance(value, str) and is_number(value) else ""


def _string(value: object, text: str | None) -> str:
    if not isinstance(value, str):
        # A YAML scalar that parsed as something else (7, 1.5, true) was meant as text: say how to keep it.
        quotable = value is not None and text is not None
        hint = "; quote it" if quotable else ""
        raise FieldError(f"must be a string, {got(value, text)}{hint}")
    # PostgreSQL text cannot hold NUL, and a lone surrogate (JSON "\ud800") cannot be written as UTF-8 at all.
    bad = _UNSTORABLE.search(value)
    if bad:
        raise FieldError(f"contains {bad.group()!r}, which cannot be stored: {shown(value)}")
    return value


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_prompt(value: object, text: str | None) -> str:
    s = _string(value, text)
    if not s.strip():
        raise FieldError(f"must not be blank, got {shown(s)}")
    if len(s) > MAX_PROMPT_CHARS:
        raise FieldError(f"is {len(s)} characters, over the {MAX_PROMPT_CHARS} limit: {shown(s)}")
    return s


def check_negative_prompt(value: object, text: str | None) -> str | None:
    if value is None:
        return None
    s = _string(value, text)
    if len(s) > MAX_PROMPT_CHARS:
        raise FieldError(f"is {len(s)} characters, over the {MAX_PROMPT_CHARS} limit: {shown(s)}")
    return s


def check_seed(value: object, text: str | None) -> int | None:
    # null: derive the seed from the run name and video id (see manifest.derive_seed).
    return None if value is None else _integer(value, text, 0, MAX_SEED)


def check_duration(value: object, text: str | None) -> float:
    return _number(value, text, 0.0, MAX_DURATION_S, lo_open=True)


def check_fps(value: object, text: str | None) -> int:
    return _integer(value, text, 1, MAX_FPS)


def check_steps(value: object, text: str | None) -> int:
    return _integer(value, text, 1, MAX_STEPS)


def check_guidance(value: object, text: str | None) -> float:
    return _number(value, text, 0.0, MAX_GUIDANCE)


def check_priority(value: object, text: str | None) -> int:
    return _integer(value, text, 0, MAX_PRIORITY)


def check_max_cost(value: object, text: str | None) -> float:
    """A run's cost cap in US dollars (jobs.claims.gate): more than 0."""
    return _number(value, text, 0.0, MAX_COST_USD, lo_open=True)


_DURATION = re.compile(r"P(?:([0-9]+)D)?(?:T(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+)S)?)?")  # ASCII digits


def check_deadline(value: object, text: str | None) -> datetime | timedelta:
    """An ISO 8601 date-time with its time zone (`2026-12-02T08:00:00Z`), returned in UTC; or an ISO 8601 duration
    after submission (`PT10H`, `P1DT2H`), for a manifest submitted on a schedule. Whether a date-time is still ahead
    is checked where the manifest is loaded (jobs.manifest.load), which knows the time."""
    raw = value  # a bare YAML date-time is text here (jobs.manifest.yaml_read: YAML 1.2, no dates)
    if not isinstance(raw, str):
        raise FieldError(f"must be an ISO 8601 date-time in UTC such as 2026-12-02T08:00:00Z, or a duration after "
                         f"submission such as PT10H; {got(value, text)}")
    raw = raw.strip()
    duration = _DURATION.fullmatch(raw)
    if duration and raw not in ("P", "PT") and not raw.endswith("T"):
        days, hours, minutes, seconds = (int(part or 0) for part in duration.groups())
        span = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if not timedelta(0) < span <= MAX_DEADLINE_AHEAD:
            raise FieldError(f"must be a duration of more than 0 and at most {MAX_DEADLINE_AHEAD.days} days, "
                             f"got {shown(raw)}")
        return span
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise FieldError(f"must be an ISO 8601 date-time in UTC such as 2026-12-02T08:00:00Z, or a duration after "
                         f"submission such as PT10H; got {shown(raw)}") from None
    if moment.tzinfo is None:
        raise FieldError(f"needs a time of day and its time zone: add Z for UTC (such as 2026-12-02T08:00:00Z), got {shown(raw)}")
    return moment.astimezone(timezone.utc)
def check_fit(value: object, text: str | None) -> str:
    """How an image of another aspect ratio meets the video's size (engine.frames.images.fit_image)."""
    s = _string(value, text)
    if s not in FITS:
        raise FieldError(f"must be one of {', '.join(FITS)}, got {shown(s)}")
    return s


# --- Names ----------------------------------------------------------------------------------------------------------

_ASCII_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_name(value: object, text: str | None) -> str:
    """An id or run name: it becomes part of an object key (`{prefix}{run name}/{video id}.mp4`), so one path part.

    Letters (any script, with their combining marks), decimal digits, `.`, `_` and `-`; NFC-normalised, so the
    same name typed on two keyboards is one name.
    """
    if isinstance(value, (bool, int, float)):
        hint = f'; quote it: "{shown(value, text)}"'
        raise FieldError(f"must be a string, {got(value, text)}{hint}")
    s = unicodedata.normalize("NFC", _string(value, text))
    if not 1 <= len(s) <= MAX_NAME_CHARS:
        raise FieldError(f"must be 1 to {MAX_NAME_CHARS} characters, got {shown(s)} ({len(s)})")
    if not _ASCII_NAME.fullmatch(s):
        for i, ch in enumerate(s):
            cat = unicodedata.category(ch)
            if not (ch in "._-" or cat[0] == "L" or cat == "Nd" or (cat[0] == "M" and i > 0)):
                raise FieldError(
                    f"may hold only letters, digits, '.', '_' and '-', got {shown(s)} (has {ch!r})"
                )
    if s in (".", ".."):
        raise FieldError(f"{shown(s)} would escape the output prefix: a name must be one file or folder")
    return s


def check_model(value: object, text: str | None, names: list[str]) -> str:
    s = _string(value, text)
    if s not in names:
        raise FieldError(f"{shown(s)} is not registered (registered: {', '.join(names)})")
    return s


def check_notify(value: object, text: str | None, allowed: tuple[str, ...] | None) -> str | None:
    """A webhook URL under an operator-allowed prefix (jobs.manifest.urls), in canonical form; None: no notification."""
    if value is None:
        return None
    url = _string(value, text)
    try:
        return check_allowed(url, allowed)
    except BadUrl as exc:
        raise FieldError(f"{shown(url)} {exc}") from None


# --- Encoding -------------------------------------------------------------------------------------------------------


def check_codec(value: object, text: str | None) -> str:
    s = _string(value, text)
    if s not in CODECS:
        raise FieldError(f"must be one of {', '.join(CODECS)}, got {shown(s)}")
    missing = None if s == DEFAULT.codec else missing_encoder(s)  # the default is PyAV's own (a dependency)
    if missing:
        raise FieldError(f"{shown(s)} needs the {missing} encoder, which this PyAV build lacks "
                         f"(av.codecs_available); use h264")
    return s


def check_crf(value: object, text: str | None) -> int:
    return _integer(value, text, CRF_MIN, CRF_MAX)


def check_preset(value: object, text: str | None) -> str:
    s = _string(value, text)
    if s not in PRESETS:
        raise FieldError(f"must be one of {', '.join(PRESETS)} (fastest to slowest), got {shown(s)}")
    return s


# --- Picture and time -----------------------------------------------------------------------------------------------

_SIZE = re.compile(r"([0-9]{1,5})[xX]([0-9]{1,5})")  # ASCII digits: \d would take '１２' and '١٢' as 12


def check_resolution(value: object, text: str | None, model: ModelInfo | None) -> tuple[int, int]:
    """WIDTHxHEIGHT or a preset, each side within the manifest's bounds and one `model` renders (without a model,
    unregistered, any side in bounds passes)."""
    s = _string(value, text)
    if s in RESOLUTION_PRESETS:
        width, height = RESOLUTION_PRESETS[s]
    else:
        m = _SIZE.fullmatch(s)
        if not m:
            raise FieldError(f"must be WIDTHxHEIGHT (e.g. 832x480) or one of {', '.join(RESOLUTION_PRESETS)}, "
                             f"got {shown(s)}")
        width, height = int(m[1]), int(m[2])
    for side, n in (("width", width), ("height", height)):
        if not MIN_SIDE <= n <= MAX_SIDE:
            raise FieldError(f"{side} {n} in {shown(s)} must be from {MIN_SIDE} to {MAX_SIDE}")
        problem = side_problem(model, side, n)
        if problem is not None:
            raise FieldError(f"{side} {n} in {shown(s)} {problem}")
    return width, height


def video_checks(model: ModelInfo | None,
                 image: Callable[[object, str | None], object]) -> dict[str, Callable[[object, str | None], object]]:
    """Field name -> checker for a video or `defaults` entry. Without a model (unregistered), any size in bounds
    passes. `image`: the manifest's image checker (jobs.manifest.images.ImageChecker), which knows its folder."""
    return {
        "id": check_name,
        "prompt": check_prompt,
        "negative_prompt": check_negative_prompt,
        "seed": check_seed,
        "resolution": lambda v, t: check_resolution(v, t, model),
        "duration_s": check_duration,
        "fps": check_fps,
        "steps": check_steps,
        "guidance": check_guidance,
        "image": image,
        "fit": check_fit,
    }
