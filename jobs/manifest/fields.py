"""What each manifest field may hold: one checker per field, returning the clean value or raising FieldError.

Checkers see a value as loaded from YAML or JSON plus, for a YAML scalar, its source text, so a message can show what
the user wrote (`001`, `.nan`, `yes`) rather than what the parser made of it (1, nan, True).
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Callable
from urllib.parse import unquote

from engine.images import FITS
from engine.models import MAX_CHUNKS, ModelInfo
from jobs.manifest.values import Date, FieldError, got, shown

MAX_PROMPT_CHARS = 10_000
MAX_NAME_CHARS = 128
MAX_SEED = 2**63 - 1  # signed 64-bit: a BIGINT column and torch.Generator.manual_seed both take it
MIN_SIDE, MAX_SIDE = 16, 2048
MAX_DURATION_S = 600.0
MAX_FPS = 60
MAX_STEPS = 200
MAX_GUIDANCE = 30.0
MAX_PRIORITY = 9
RESOLUTION_PRESETS = {"480p": (832, 480), "720p": (1280, 720)}

VIDEO_FIELDS = ("id", "prompt", "negative_prompt", "seed", "resolution", "duration_s", "fps", "steps", "guidance",
                "image", "fit")
RUN_FIELDS = ("name", "model", "output", "priority", "defaults", "videos")

# --- Scalars --------------------------------------------------------------------------------------------------------


def _integer(value: object, text: str | None, lo: int, hi: int) -> int:
    # bool is an int in Python, and YAML 1.1 reads `yes`/`on` as True: neither may pass as 1.
    if type(value) is not int:
        hint = "; write it without quotes" if isinstance(value, str) else ""
        raise FieldError(f"must be an integer from {lo} to {hi}, {got(value, text)}{hint}")
    if not lo <= value <= hi:
        raise FieldError(f"must be an integer from {lo} to {hi}, got {shown(value, text)}")
    return value


def _number(value: object, text: str | None, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = "; write it without quotes" if isinstance(value, str) else ""
        raise FieldError(f"must be a number, {got(value, text)}{hint}")
    if not math.isfinite(value):
        raise FieldError(f"must be a finite number, got {shown(value, text)}")
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"more than {lo:g}" if lo_open else f"at least {lo:g}"
        raise FieldError(f"must be {bound} and at most {hi:g}, got {shown(value, text)}")
    return float(value)


def _string(value: object, text: str | None) -> str:
    if not isinstance(value, str):
        # A YAML scalar that parsed as something else (001, yes, 2024-01-01) was meant as text: say how to keep it.
        quotable = value is not None and (text is not None or isinstance(value, Date))
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


def check_fit(value: object, text: str | None) -> str:
    """How an image of another aspect ratio meets the video's size (engine.images.fit_image)."""
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
    if isinstance(value, bool) or isinstance(value, (int, float, Date)):
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


# --- Output URIs ----------------------------------------------------------------------------------------------------

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_output(value: object, text: str | None) -> str | None:
    """`file:///abs/dir/`, `file://./rel/dir/` or `s3://bucket/prefix/`; returned with a trailing `/`."""
    if value is None:
        return None
    uri = _string(value, text)
    if _CONTROL.search(uri):
        raise FieldError(f"contains a control character: {shown(uri)}")
    if not uri.endswith("/"):
        uri += "/"  # keys are `{prefix}{run name}/...`: without it `s3://b/out` would write `s3://b/outNAME/`
    output_key(uri)
    return uri


def output_key(uri: str) -> str:
    """The form two output URIs are compared in: absolute, `.`/`..` resolved, percent-decoded as the store does."""
    if uri.startswith("file://"):
        path = unquote(uri[len("file://") :])
        # The forms storage.stores.open_store accepts.
        if not (path.startswith(("/", "./", "../")) or path in (".", "..")):
            raise FieldError(f"must be file:///absolute/dir/ or file://./relative/dir/, got {shown(uri)}")
        path = os.path.abspath(path)
        return "file://" + (path if path.endswith("/") else path + "/")
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        if not _BUCKET.fullmatch(bucket):
            raise FieldError(f"needs a bucket name (3-63 of a-z, 0-9, '.', '-'): s3://BUCKET/prefix/, got {shown(uri)}")
        parts = prefix.split("/")[:-1] if prefix else []
        # S3 keeps `..` literally but a local mirror would not; `?` and `#` would be cut off by URL parsing.
        if any(p in ("", ".", "..") for p in parts) or "?" in prefix or "#" in prefix or "\\" in prefix:
            raise FieldError(f"prefix must be plain path parts (no '', '.', '..', '?', '#', '\\'), got {shown(uri)}")
        return f"s3://{bucket}/{prefix}"
    raise FieldError(f"must be a file:// or s3:// URI, got {shown(uri)}")


def check_output_allowed(uri: str, allowed: list[str]) -> None:
    """Refuse an output outside every operator-allowed prefix; compares whole path parts, so a/ never allows ab/."""
    key = output_key(uri)
    if not any(key.startswith(a) for a in allowed):
        raise FieldError(f"{shown(uri)} is not under an allowed output prefix ({', '.join(allowed)})")


# --- Picture and time -----------------------------------------------------------------------------------------------

_SIZE = re.compile(r"(\d{1,5})[xX](\d{1,5})")


def check_resolution(value: object, text: str | None, multiple: int) -> tuple[int, int]:
    s = _string(value, text)
    if s in RESOLUTION_PRESETS:
        return RESOLUTION_PRESETS[s]
    m = _SIZE.fullmatch(s)
    if not m:
        raise FieldError(f"must be WIDTHxHEIGHT (e.g. 832x480) or one of {', '.join(RESOLUTION_PRESETS)}, got {shown(s)}")
    width, height = int(m[1]), int(m[2])
    for side, n in (("width", width), ("height", height)):
        if not MIN_SIDE <= n <= MAX_SIDE or n % multiple:
            raise FieldError(
                f"{side} {n} in {shown(s)} must be a multiple of {multiple} from {MIN_SIDE} to {MAX_SIDE}"
            )
    return width, height


def plan_frames(model: ModelInfo, duration_s: float, fps: int) -> int:
    """The frame count the model renders for a requested duration: nearest whole frame, then the model's grid.
    Beyond the model's window the video is rendered in chunks (engine.chunks), up to MAX_CHUNKS of them."""
    # Half-up, like ModelInfo.valid_frames, not Python's round-half-even.
    frames = model.valid_frames(math.floor(duration_s * fps + 0.5))
    plan = model.chunk_plan(frames)
    chunks = plan.chunks
    if chunks > MAX_CHUNKS:
        latents = plan.window_latents + (MAX_CHUNKS - 1) * (plan.window_latents - plan.overlap)
        longest = 1 + (latents - 1) * model.temporal_factor
        raise FieldError(
            f"{duration_s:g} s at {fps} fps is {frames} frames, {chunks} chunks of {model.name}'s {model.max_frames}-"
            f"frame window; at most {MAX_CHUNKS} chunks ({longest} frames), so at most {longest / fps:g} s at {fps} fps"
        )
    return frames


def video_checks(model: ModelInfo | None,
                 image: Callable[[object, str | None], object]) -> dict[str, Callable[[object, str | None], object]]:
    """Field name -> checker for a video or `defaults` entry. Without a model (unregistered), any multiple passes.
    `image`: the manifest's image checker (jobs.manifest.images.ImageChecker), which knows its folder."""
    multiple = model.spatial_multiple if model else 1
    return {
        "id": check_name,
        "prompt": check_prompt,
        "negative_prompt": check_negative_prompt,
        "seed": check_seed,
        "resolution": lambda v, t: check_resolution(v, t, multiple),
        "duration_s": check_duration,
        "fps": check_fps,
        "steps": check_steps,
        "guidance": check_guidance,
        "image": image,
        "fit": check_fit,
    }
