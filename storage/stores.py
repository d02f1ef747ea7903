"""Where finished MP4s go: `open_store` picks a store from an output URI (a local folder or an S3 bucket), and the
interface and errors every store shares (storage.base) are offered here with it."""

from __future__ import annotations

from pathlib import Path

from storage import local, s3
from storage.base import (
    IntegrityError,
    KeyTooLong,
    ObjectConflict,
    ObjectNotFound,
    ObjectTooLarge,
    Store,
    StoredObject,
    StoreError,
    StoreUnavailable,
    TooLong,
    sha256_hex,
)
from storage.local import LocalStore
from storage.s3 import S3Store

__all__ = ["IntegrityError", "KeyTooLong", "ObjectConflict", "ObjectNotFound", "ObjectTooLarge", "Store", "StoredObject",
           "StoreError", "StoreUnavailable", "TooLong", "key_too_long", "open_store", "sha256_hex"]


def open_store(uri: str) -> Store:
    """`file:///abs/dir/`, `file://./rel/dir/` or a plain path -> LocalStore; `s3://bucket/prefix/` -> S3Store."""
    where = _where(uri)
    return LocalStore(Path(where[1])) if where[0] == "file" else S3Store(where[1], where[2])


def key_too_long(uri: str, key: str) -> TooLong | None:
    """How `key` overflows the store `uri` names (open_store's forms), or None; opens no connection."""
    where = _where(uri)
    if where[0] == "file":
        return local.too_long(where[1], key)
    prefix = where[2].strip("/")  # as S3Store holds it
    return s3.too_long(f"{prefix}/" if prefix else "", key)


def _where(uri: str) -> tuple[str, ...]:
    """("file", folder) or ("s3", bucket, prefix). The text after the scheme is taken as it is, never
    percent-decoded: the folder or prefix a caller checked is the one written to."""
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"store URI must be a non-empty string, got {uri!r}")
    if "://" not in uri:
        return "file", uri
    scheme, rest = uri.split("://", 1)
    if scheme.lower() == "file":
        # file:///abs has an empty host; file://./rel is not standard but reads naturally for "relative to here".
        if rest.startswith("/") or rest.startswith("./") or rest.startswith("../") or rest in (".", ".."):
            return "file", rest
        raise ValueError(f"unsupported file URI {uri!r}: use file:///absolute/path/ or file://./relative/path/")
    if scheme.lower() == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ValueError(f"S3 URI {uri!r} names no bucket: use s3://bucket/prefix/")
        return "s3", bucket, prefix
    raise ValueError(f"unsupported store URI {uri!r}: use file:///path/, a plain path, or s3://bucket/prefix/")
