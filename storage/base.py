"""The store interface every backend implements (storage.local, storage.s3), its errors and its key rules.

Every store is write-once per key: a put of the same bytes is a no-op that reports `existed=True`, a put of different
bytes raises `ObjectConflict` and never overwrites, and every write is read back and hashed before it counts.
That makes a retried or duplicated task harmless, which is what lets the worker use acks_late.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from faults import Decision


class StoreError(Exception):
    """Base of every error a store raises on purpose (and what the S3 store makes of a request the server refused
    outright: access denied, no such bucket). Each class carries its `decision` (faults.Decision), which the worker
    reads (jobs.render.attempts.decide): a store error that another attempt would meet again fails the video now."""

    decision: ClassVar[Decision] = Decision.FAIL_NOW


class StoreUnavailable(StoreError):
    """The store could not be reached or answered with a server error (network down, endpoint refused, 5xx)."""

    decision: ClassVar[Decision] = Decision.RETRY


class ObjectConflict(StoreError):
    """A different object already exists at the key. It is never overwritten; retrying cannot help."""

    decision: ClassVar[Decision] = Decision.FAIL_NOW


class IntegrityError(StoreError):
    """The stored bytes did not hash to the expected SHA-256; the bad object was deleted, so a retry starts clean."""

    decision: ClassVar[Decision] = Decision.RETRY


class ObjectNotFound(StoreError):
    """`get` asked for a key that holds no object."""

    decision: ClassVar[Decision] = Decision.FAIL_NOW


class KeyTooLong(StoreError):
    """The key (or a name the store would write for it) is over the store's byte limit; it never will fit."""

    decision: ClassVar[Decision] = Decision.FAIL_NOW


class ObjectTooLarge(StoreError):
    """`get` with `max_bytes` found a larger object: nothing of it was read (a manifest's image over its limit)."""

    decision: ClassVar[Decision] = Decision.FAIL_NOW


@dataclass(frozen=True)
class TooLong:
    """How a key overflows a store: which name or whole key, its size and the limit, in UTF-8 bytes."""

    what: str  # "file name '.a.mp4.0123456789abcdef.tmp'", "key 'renders/run/a.mp4'", ...
    bytes: int
    limit: int

    @property
    def excess(self) -> int:
        return self.bytes - self.limit

    def __str__(self) -> str:
        return f"its {self.what} would be {self.bytes:,} bytes, over the {self.limit:,}-byte limit"


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def quoted(name: str, most: int = 60) -> str:
    """A name for a message: repr'd (control characters escaped), cut to about `most` characters."""
    text = repr(name)
    return text if len(text) <= most else text[: most - 4] + "...'"


def worst(found: list[TooLong]) -> TooLong | None:
    """The overflow that needs the most bytes cut, or None when everything fits."""
    over = [t for t in found if t.excess > 0]
    return max(over, key=lambda t: t.excess) if over else None


@dataclass(frozen=True)
class StoredObject:
    uri: str
    key: str
    bytes: int
    sha256: str
    existed: bool  # the same bytes were already there, so the put changed nothing


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Store(ABC):
    @abstractmethod
    def put(
        self, key: str, data: bytes, *, sha256: str, content_type: str = "video/mp4", metadata: dict[str, str]
    ) -> StoredObject:
        """Store `data` at `key` unless the same bytes are already there; verify what was stored hashes to `sha256`."""

    @abstractmethod
    def uri_for(self, key: str) -> str: ...

    @abstractmethod
    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The object's bytes; ObjectTooLarge, before reading them, when it is over `max_bytes`."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def stat(self, key: str) -> StoredObject | None:
        """The object at `key` (size and SHA-256, existed=True), or None if the key is free."""

    @abstractmethod
    def replace(self, key: str, data: bytes, *, content_type: str) -> str:
        """Write `data` at `key` whatever is there, atomically (readers see the old or the new object, never half);
        returns its URI. Only for reelbatch's own run files (results.jsonl): a video is never replaced."""

    @abstractmethod
    def too_long(self, key: str) -> TooLong | None:
        """None if this store can hold an object at `key` (every name it writes for it, within its limits)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object at `key`; nothing if there is none. Only for reelbatch's own scratch objects (a long
        video's chunk checkpoints): a stored video is never deleted."""


def check_key(key: str) -> str:
    """Return `key` if it is a plain relative key (`run/video-1.mp4`), else raise ValueError.

    Both stores apply the same rule so that a manifest that works against a local folder also works against S3,
    and so that no key can climb out of a local store's root.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"store key must be a non-empty string, got {key!r}")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"store key must be relative, with '/' separators, got {key!r}")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"store key must not contain '..', '.' or empty path components, got {key!r}")
    return key


def check_sha256(sha256: str) -> str:
    """Return the lowercase hex digest, or raise ValueError: a malformed checksum is a caller bug, not a store fault."""
    normal = sha256.lower() if isinstance(sha256, str) else ""
    if not _SHA256_HEX.fullmatch(normal):
        raise ValueError(f"sha256 must be 64 hex characters, got {sha256!r}")
    return normal
