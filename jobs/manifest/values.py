"""Manifest values as loaded: each keeps its line and the text it was written as, so a message can name both; the
limits on a whole file; and how a value is shown back to the user."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_VIDEOS = 100_000
# A video with every field is 19 YAML nodes (mapping + 9 keys + 9 values); 25 a video leaves room at MAX_VIDEOS.
# The count includes alias expansions, which is what stops a "billion laughs" document.
MAX_NODES = 25 * MAX_VIDEOS
MAX_DEPTH = 32



class FieldError(Exception):
    """A value a field cannot hold; the message names the value as written."""


# --- Values as loaded ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Item:
    """One loaded value and where it came from."""

    value: object
    line: int
    text: str | None = None  # the source text of a scalar (YAML) or of a number (JSON)
    alias: str | None = None  # the anchor's name when this is a YAML alias (*name) used at `line`


class Map:
    """A mapping whose values keep their lines."""

    __slots__ = ("line", "items")

    def __init__(self, line: int, items: dict[str, Item]):
        self.line, self.items = line, items


class Seq:
    __slots__ = ("line", "items")

    def __init__(self, line: int, items: list[Item]):
        self.line, self.items = line, items


class _Invalid:
    def __repr__(self) -> str:
        return "INVALID"


# A value the loader already reported (a forbidden tag, a recursive alias); checkers skip it so it is reported once.
INVALID = _Invalid()

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80


def shown(value: object, text: str | None = None) -> str:
    """The value as the user wrote it, cut to about 60 characters."""
    if value is None:
        s = "an empty value" if text == "" else text or "null"
    elif isinstance(value, Map):
        s = "{" + ", ".join(list(value.items)[:4]) + (", ...}" if len(value.items) > 4 else "}")
    elif isinstance(value, (Seq, list)):
        s = f"a list of {len(value.items if isinstance(value, Seq) else value)} items"
    elif text is not None and not isinstance(value, str):
        s = text
    else:
        s = _repr.repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


def kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Map):
        return "a mapping"
    if isinstance(value, (Seq, list)):
        return "a list"
    return "null" if value is None else type(value).__name__


def got(value: object, text: str | None) -> str:
    return f"got {shown(value, text)}" + ("" if value is None else f" ({kind(value)})")
