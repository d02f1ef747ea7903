"""How a setting's text is read: one reader per type, raising BadValue with what the value must be."""

from __future__ import annotations

import math
import re
from pathlib import Path

from engine.models.registry import MODEL_NAME
from jobs.manifest.outputs import canonical_output
from jobs.manifest.urls import BadUrl, allowed_prefixes
from jobs.manifest.values import FieldError, shown


class BadValue(ValueError):
    """The text cannot be read as the variable's type; the message says what it must be."""


def text(raw: str) -> str:
    return raw


# ASCII digits only, as in a manifest (jobs.manifest.scalars): float() alone would also read '１２', '1_0' and 'inf'.
_DECIMAL = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


def number(raw: str) -> float:
    if not _DECIMAL.fullmatch(raw.strip()):
        raise BadValue("expected a number (ASCII digits, e.g. 2.5)")
    value = float(raw)
    if not math.isfinite(value):
        raise BadValue("expected a finite number")
    return value


def positive(raw: str) -> float:
    value = number(raw)
    if not value > 0:
        raise BadValue("must be a positive finite number")
    return value


def price(raw: str) -> float:
    """A price or a quantity that may be zero (free storage, no egress), never negative."""
    value = number(raw)
    if value < 0:
        raise BadValue("must be zero or a positive finite number")
    return value


def count(raw: str) -> int:
    """A whole number of at least 1, written as one: `0.5`, `-1` and `4.0` are refused, never truncated."""
    if not re.fullmatch(r"[0-9]+", raw.strip()) or int(raw) < 1:
        raise BadValue("must be a whole number of at least 1")
    return int(raw)


def count_or_auto(raw: str) -> int:
    """`auto` (read as 0: the code using it picks) or a whole number of at least 1."""
    if raw.strip() == "auto":
        return 0
    try:
        return count(raw)
    except BadValue:
        raise BadValue("must be auto or a whole number of at least 1") from None


def port(raw: str) -> int:
    if not re.fullmatch(r"[0-9]+", raw.strip()) or not 1 <= int(raw) <= 65535:
        raise BadValue("must be a TCP port, a whole number from 1 to 65535")
    return int(raw)


def fraction(raw: str) -> float:
    value = number(raw)
    if not 0 < value <= 1:
        raise BadValue("must be in (0, 1]")
    return value


def fraction_or_zero(raw: str) -> float:
    value = number(raw)
    if not 0 <= value <= 1:
        raise BadValue("must be in [0, 1]")
    return value


def switch(raw: str) -> bool:
    word = raw.strip().lower()
    if word in ("1", "true", "on", "yes"):
        return True
    if word in ("0", "false", "off", "no"):
        return False
    raise BadValue("expected 1/0 (or on/off, true/false)")


def envelope_mode(raw: str) -> str:
    if raw.strip() not in ("use", "measure", "off"):
        raise BadValue("must be use, measure or off")
    return raw.strip()


def one_or_two(raw: str) -> int:
    if raw.strip() not in ("1", "2"):
        raise BadValue("must be 1 or 2")
    return int(raw)


def device_list(raw: str) -> tuple[int, ...]:
    """GPU indices, comma-separated and each once: `0,1,2,3`."""
    parts = [p.strip() for p in raw.split(",")]
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts) or len(set(map(int, parts))) != len(parts):
        raise BadValue("must be GPU indices separated by commas, each once (0,1,2,3)")
    return tuple(int(p) for p in parts)


def device(raw: str) -> str:
    if not re.fullmatch(r"auto|cpu|mps|cuda(:[0-9]+)?", raw.strip()):
        raise BadValue("must be auto, cpu, cuda, cuda:N or mps")
    return raw.strip()


def output(raw: str) -> str:
    """An output URI, checked as a manifest's `output` is (jobs.manifest.outputs); made canonical where it is used,
    since a relative folder means the working folder of the process that submits."""
    try:
        return _output_part(raw)
    except BadValue as exc:
        # The variable's error adds what it got: the check's own ", got ..." of the same text is not said twice.
        said, same = str(exc), f", got {shown(raw.strip())}"
        raise BadValue(said[:-len(same)] if said.endswith(same) else said) from None


def _output_part(raw: str) -> str:
    """One URI of a list of them, its error naming it (the variable's adds the whole list)."""
    try:
        canonical_output(raw.strip())
    except FieldError as exc:
        raise BadValue(str(exc)) from None
    return raw.strip()


def prefixes(raw: str) -> tuple[str, ...]:
    return tuple(_output_part(p) for p in raw.split(",") if p.strip())


def input_prefixes(raw: str) -> tuple[str, ...]:
    """REELBATCH_ALLOWED_INPUTS: URI prefixes as `prefixes` reads them, and plain absolute folders (`/dir/`), each
    checked as its file:// URI is; jobs.manifest.images.allowed_input_key reads all three forms."""
    found = []
    for prefix in (p.strip() for p in raw.split(",")):
        if prefix.startswith("/"):
            _output_part("file://" + prefix)
            found.append(prefix)
        elif prefix.startswith(("file://", "s3://")):
            found.append(_output_part(prefix))
        elif prefix:
            raise BadValue(f"{prefix!r} must be an absolute folder (/dir/), file:///dir/ or s3://bucket/prefix/")
    return tuple(found)


def webhook_prefixes(raw: str) -> tuple[str, ...]:
    try:
        return allowed_prefixes(raw)
    except BadUrl as exc:
        raise BadValue(str(exc)) from None


# The key signs every webhook delivery (HMAC-SHA256): shorter than this is guessable offline from one delivery.
MIN_SECRET_CHARS = 16


def secret(raw: str) -> str:
    if raw != raw.strip():
        raise BadValue("must not begin or end with white space (receivers would sign with another key)")
    if len(raw) < MIN_SECRET_CHARS:
        raise BadValue(f"must be at least {MIN_SECRET_CHARS} characters")
    return raw


def path(raw: str) -> Path:
    return Path(raw).expanduser()


def model_names(raw: str) -> tuple[str, ...]:
    """Comma-separated model names, at least one."""
    names = tuple(p.strip() for p in raw.split(",") if p.strip())
    if not names or not all(re.fullmatch(MODEL_NAME, n) for n in names):
        raise BadValue("expected comma-separated model names (letters, digits, '.', '_' and '-')")
    return names
