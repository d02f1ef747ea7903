"""Objects reelbatch reads rather than writes: a manifest's images, by URI (`file:///abs/path` or `s3://bucket/key`).

Read through the same stores as outputs, so a local file and an S3 object fail the same ways (ObjectNotFound,
ObjectTooLarge, StoreUnavailable), and never more than `max_bytes` of one is read. One store per local root or
bucket per process: an S3 client is made once, not per image.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

from storage.base import Store
from storage.local import LocalStore
from storage.s3 import S3Store


def read_input(uri: str, *, max_bytes: int) -> bytes:
    """The bytes at `uri`; ObjectTooLarge (nothing read) when there are more than `max_bytes`."""
    store, key = input_store(uri)
    return store.get(key, max_bytes=max_bytes)


def input_store(uri: str) -> tuple[Store, str]:
    """The store holding `uri` and the object's key in it. ValueError for any other form of URI."""
    if uri.startswith("file:///"):
        path = Path(unquote(uri[len("file://") :]))
        return _local_root(path.anchor), path.relative_to(path.anchor).as_posix()
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://") :].partition("/")
        if bucket and key:
            return _bucket(bucket), key
    raise ValueError(f"input URI must be file:///absolute/path or s3://bucket/key, got {uri!r}")


@lru_cache(maxsize=8)
def _local_root(anchor: str) -> Store:
    return LocalStore(anchor)


@lru_cache(maxsize=64)
def _bucket(bucket: str) -> Store:
    return S3Store(bucket)
