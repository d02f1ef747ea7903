"""The number rule: what an unquoted YAML value is, the same for YAML and for JSON lines.

A plain (unquoted) YAML scalar is read by the YAML 1.2 core schema (YAML 1.2.2, section 10.3.2), not by YAML 1.1's
rules, which PyYAML follows and which read `010` as 8, `1:30` as 90, `yes` as true and `1e1` as text. Under the core
schema every number JSON can write means the same number in YAML (`10`, `-2.5`, `1e1`, `true`, `null`), and YAML adds
`0o17`, `0x1F`, `.5`, `1.`, `.inf` and `.nan`. Digits are ASCII only: `１２` and `١٢` are text. One form is refused
rather than read: an integer with a leading zero (`010`), which YAML 1.1 reads as octal and YAML 1.2 as decimal; the
message says how to write either. Everything else (`1:30`, `1_000`, `yes`, `2024-01-01`) is a string.
"""

from __future__ import annotations

import re

from jobs.manifest.values import FieldError, shown

_NULL = ("", "~", "null", "Null", "NULL")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"[-+]?[0-9]+")
_OCT = re.compile(r"0o[0-7]+")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_LEADING_ZERO = re.compile(r"[-+]?0[0-9]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")
# The first characters a plain scalar that is not a string can start with: others skip every pattern.
_MAYBE = frozenset("0123456789+-.~nNtTfF")


def plain_scalar(text: str) -> object:
    """An unquoted YAML value: None, a bool, an int, a float or the text itself."""
    if text and text[0] not in _MAYBE:
        return text
    if text in _NULL:
        return None
    if text in _BOOL:
        return _BOOL[text]
    number = _number(text)
    return text if number is None else number


def tagged_scalar(name: str, text: str) -> object:
    """A value with an explicit core tag (`!!int 7`): read by that tag's rule of the core schema, or refused."""
    if name == "str":
        return text
    value: object = None
    if name == "null" and text in _NULL:
        return None
    if name == "bool":
        value = _BOOL.get(text)
    elif name == "int":
        value = _number(text)
        value = value if type(value) is int else None
    elif name == "float":
        value = _number(text)
        value = None if value is None else float(value)
    if value is None:
        raise FieldError(f"{shown(text)} cannot be read as {name}")
    return value


def is_number(text: str) -> bool:
    """Whether `text` would be a number if written without quotes (for a "write it without quotes" hint)."""
    try:
        return _number(text) is not None
    except FieldError:
        return False


def _number(text: str) -> int | float | None:
    if _LEADING_ZERO.fullmatch(text):
        digits, decimal = text.lstrip("+-"), int(text)
        if set(digits) <= set("01234567"):
            old = f"octal {int(text, 8)}"
            octal = "" if digits != text else f", or 0o{digits.lstrip('0') or '0'} for octal"
        else:
            old, octal = "text", ""
        raise FieldError(f"{text} is ambiguous: YAML 1.1 reads it as {old}, YAML 1.2 as {decimal}; write "
                         f"{decimal}{octal}, or quote it for text")
    try:
        if _INT.fullmatch(text):
            return int(text)
        if _OCT.fullmatch(text):
            return int(text[2:], 8)
        if _HEX.fullmatch(text):
            return int(text[2:], 16)
    except ValueError:  # over Python's 4,300-digit limit on reading an integer
        raise FieldError(f"{shown(text)} cannot be read as int (too many digits)") from None
    if _FLOAT.fullmatch(text):
        return float(text)  # an exponent past the float range reads as inf; the field check names the text
    if _INF.fullmatch(text):
        return float("-inf") if text.startswith("-") else float("inf")
    if _NAN.fullmatch(text):
        return float("nan")
    return None
