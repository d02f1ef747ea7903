"""Reading a manifest file: bytes to text (size limit, BOM, UTF-8 with the line of a bad byte), and JSON lines to
values that keep their lines. YAML is read by jobs.manifest.yaml_read; jobs.manifest.load checks the values against the
field rules in jobs.manifest.fields."""

from __future__ import annotations

import json
import os
import re
from functools import partial
from pathlib import Path

from jobs.manifest.values import INVALID, MAX_FILE_BYTES, MAX_VIDEOS, Item, Map, shown

_BOM = b"\xef\xbb\xbf"


def read_text(path: Path, report) -> str | None:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            # Refuse a big file before reading it; read one byte past the limit for pipes and growing files.
            data = b"" if size > MAX_FILE_BYTES else fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        report(0, "(file)", f"cannot be read: {exc.strerror or exc}")
        return None
    if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
        report(0, "(file)", f"is {max(size, len(data)):,} bytes, over the {MAX_FILE_BYTES >> 20} MiB limit; "
                            "split it into several runs")
        return None
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        report(line, "(file)", f"is not UTF-8: byte {data[exc.start:exc.start + 1]!r} at column {column}; "
                               "save the file as UTF-8")
        return None


class _JsonNumber(float):
    """A JSON number with a fraction or an exponent (and Python's NaN and Infinity), keeping its text: `1e400` is
    read as inf, and a message must show what the user wrote."""

    def __new__(cls, text: str):
        self = super().__new__(cls, text)
        self.text = text
        return self

    def __repr__(self) -> str:
        return self.text


def _json_object(report, line: int, pairs: list[tuple[str, object]]) -> Map:
    items: dict[str, Item] = {}
    for key, value in pairs:
        if key in items:
            report(line, key, f"duplicate field {key!r} (values {shown(items[key].value)} and {shown(value)})")
        else:
            items[key] = Item(value, line, getattr(value, "text", None))
    return Map(line, items)


def load_jsonl(text: str, report) -> list[Item]:
    records: list[Item] = []
    # Not splitlines(): U+2028 may sit unescaped inside a JSON string.
    for n, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        if len(records) == MAX_VIDEOS:
            report(n, "(file)", f"has more than {MAX_VIDEOS:,} videos; split it into several runs")
            return []
        try:
            value = json.loads(raw, object_pairs_hook=partial(_json_object, report, n), parse_float=_JsonNumber,
                               parse_constant=_JsonNumber)
        except json.JSONDecodeError as exc:
            value = _raw_controls(raw, n, report) if exc.msg.startswith("Invalid control character") else None
            if value is None:
                report(n, "(syntax)", f"{exc.msg} at column {exc.colno}: "
                                      f"{shown(raw[max(0, exc.pos - 30):exc.pos + 30])}")
                continue
        except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; [[[[...
            report(n, "(syntax)", f"{type(exc).__name__}: {str(exc)[:80]}")
            continue
        records.append(Item(value, n))
    return records


def _raw_controls(raw: str, line: int, report) -> Map | None:
    """A raw control character (a NUL byte, an ESC) inside a JSON string: report each field that holds one, with
    its value, rather than only a column, and return the record with those fields INVALID so the rest is checked.
    None when that is not the line's only fault."""
    try:
        value = json.loads(raw, strict=False, object_pairs_hook=partial(_json_object, lambda *_: None, line),
                           parse_float=_JsonNumber, parse_constant=_JsonNumber)
    except ValueError:
        return None
    if not isinstance(value, Map):
        return None
    raw_chars = set(_JSON_RAW.findall(raw))  # as written in the line, not escaped as \u001b
    found = [(key, ch) for key, item in value.items.items() if isinstance(item.value, str)
             for ch in [next((c for c in item.value if c in raw_chars), None)] if ch is not None]
    for key, ch in found:
        text = value.items[key].value
        report(line, key, raw_control_message(text, ch))
        value.items[key] = Item(INVALID, line, text)
    return value if found else None


# What a JSON string may not hold unescaped (RFC 8259, section 7); YAML refuses a wider set (jobs.manifest.yaml_read).
_JSON_RAW = re.compile("[\x00-\x1f]")


def raw_control_message(text: str, ch: str) -> str:
    """A value holding the control character `ch` as it is, shown with the character escaped."""
    return (f"holds the control character {ch!r} as it is, which a manifest cannot: {shown(text)}; remove it, or "
            f"write it as an escape (\\u{ord(ch):04x} in a JSON or double-quoted YAML string) if it belongs")
