"""Output URIs: the one form an output is checked, recorded and opened in, and whether it lies under an allowed prefix.

An output is read once into its canonical form, `file:///absolute/folder/` or `s3://bucket/prefix/`, and that string
is what REELBATCH_ALLOWED_OUTPUTS is compared with, what the run records and what the store opens
(storage.stores.open_store takes it literally). Nothing is percent-decoded and no `.` or `..` is resolved after the
check: text that would need either is refused instead, so no two readings of one URI can differ.
"""

from __future__ import annotations

import os
import re

from jobs.manifest.values import FieldError, got, shown
from storage.base import utf8_len
from storage.local import NAME_MAX

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Control characters would be written into folder names and printed to terminals; a lone surrogate cannot be
# written as UTF-8 at all (so neither stored in PostgreSQL nor used as a path).
_UNUSABLE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def check_output(value: object, text: str | None) -> str | None:
    """The manifest's `output` (or `--output`) in its canonical form; None: the operator's default."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(f"must be a file:// or s3:// URI, {got(value, text)}")
    return canonical_output(value)


def canonical_output(uri: str) -> str:
    """`file:///abs/dir/`, `file://./rel/dir/` (made absolute here, once) or `s3://bucket/prefix/` -> the canonical
    form, ending in '/'; anything that would need decoding or resolving to compare is a FieldError."""
    bad = _UNUSABLE.search(uri)
    if bad:
        raise FieldError(f"contains the control character {bad.group()!r}: {shown(uri)}")
    if "%" in uri:
        # Decoding in one place and not another is how an output once escaped its allowed prefix (a%2Fb/../..).
        raise FieldError(f"contains '%': an output is not percent-decoded, so write each character itself "
                         f"(a space as a space), got {shown(uri)}")
    if "\\" in uri:
        raise FieldError(f"contains '\\': separate folders with '/', got {shown(uri)}")
    if uri.startswith("file://"):
        return "file://" + _folder(uri, uri[len("file://"):])
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        if not _BUCKET.fullmatch(bucket):
            raise FieldError(f"needs a bucket name (3-63 of a-z, 0-9, '.', '-'): s3://BUCKET/prefix/, got {shown(uri)}")
        if "?" in prefix or "#" in prefix:  # a URL reader would cut the key there
            raise FieldError(f"prefix must not contain '?' or '#', got {shown(uri)}")
        return f"s3://{bucket}/" + "".join(f"{part}/" for part in _plain_parts(uri, prefix))
    raise FieldError(f"must be a file:// or s3:// URI, got {shown(uri)}")


def _folder(uri: str, path: str) -> str:
    """The absolute folder of a file:// URI's path, ending in '/'. Only a relative path's leading `.` and `..` parts
    are resolved (against the working directory); anywhere else they are refused."""
    if path.startswith("/"):
        base, rest = "/", path[1:]
    else:
        parts = path.split("/")
        lead = 0
        while lead < len(parts) and parts[lead] in (".", ".."):
            lead += 1
        if lead == 0:
            raise FieldError(f"must be file:///absolute/dir/ or file://./relative/dir/, got {shown(uri)}")
        base, rest = os.path.abspath("/".join(parts[:lead])), "/".join(parts[lead:])
    names = _plain_parts(uri, rest)
    for name in names:
        if utf8_len(name) > NAME_MAX:
            raise FieldError(f"has a folder name of {utf8_len(name):,} bytes, over the {NAME_MAX}-byte limit of "
                             f"a file name: {shown(uri)}")
    return base.rstrip("/") + "/" + "".join(f"{name}/" for name in names)


def _plain_parts(uri: str, path: str) -> list[str]:
    """The folder names of `path` (one trailing '/' allowed); an empty, `.` or `..` part is refused."""
    if path.endswith("/"):
        path = path[:-1]
    parts = path.split("/") if path else []
    if any(part in ("", ".", "..") for part in parts):
        raise FieldError(f"must be plain folder names after the start (no empty, '.' or '..' part), got {shown(uri)}")
    return parts


def check_output_allowed(written: str, canonical: str, allowed: list[str]) -> None:
    """Refuse an output outside every allowed prefix. Both sides are canonical and end in '/', so a prefix matches
    whole folder names only: a/ allows a/b/ but never ab/."""
    if not any(canonical.startswith(prefix) for prefix in allowed):
        read = "" if canonical == written else f", read as {canonical}"
        raise FieldError(f"{shown(written)}{read} is not under an allowed output prefix ({', '.join(allowed)})")
