"""Where finished MP4s go: `open_store` picks a store from an output URI (a local folder or an S3 bucket), and the
interface and errors every store shares (storage.base) are offered here with it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from storage.base import (
    IntegrityError,
    ObjectConflict,
    ObjectNotFound,
    ObjectTooLarge,
    Store,
    StoredObject,
    StoreError,
    StoreUnavailable,
    sha256_hex,
)
from storage.local import LocalStore
from storage.s3 import S3Store

__all__ = ["IntegrityError", "ObjectConflict", "ObjectNotFound", "ObjectTooLarge", "Store", "StoredObject", "StoreError",
           "StoreUnavailable", "open_store", "sha256_hex"]


def open_store(uri: str) -> Store:
    """`file:///abs/dir/`, `file://./rel/dir/` or a plain path -> LocalStore; `s3://bucket/prefix/` -> S3Store."""
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"store URI must be a non-empty string, got {uri!r}")
    if "://" not in uri:
        return LocalStore(Path(uri))
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "file":
        rest = unquote(uri[len("file://") :])
        # file:///abs has an empty host; file://./rel is not standard but reads naturally for "relative to here".
        if rest.startswith("/") or rest.startswith("./") or rest.startswith("../") or rest in (".", ".."):
            return LocalStore(Path(rest))
        raise ValueError(f"unsupported file URI {uri!r}: use file:///absolute/path/ or file://./relative/path/")
    if scheme == "s3":
        parts = urlsplit(uri)
        if not parts.netloc:
            raise ValueError(f"S3 URI {uri!r} names no bucket: use s3://bucket/prefix/")
        return S3Store(parts.netloc, parts.path)
    raise ValueError(f"unsupported store URI {uri!r}: use file:///path/, a plain path, or s3://bucket/prefix/")
