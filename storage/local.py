"""A store in a local (or mounted) folder: `file:///abs/dir/`, `file://./rel/dir/` or a plain path."""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
from pathlib import Path

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
    check_key,
    check_sha256,
    quoted,
    utf8_len,
    worst,
)

# OS errors that may pass on their own (a full disk being cleaned, a flaky network mount), so worth a retry.
_TRANSIENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ETIMEDOUT, errno.ESTALE, errno.EAGAIN, errno.EINTR}

# Linux's limits (linux/limits.h), shared by ext4, xfs and btrfs: a file name holds NAME_MAX bytes, and a path handed
# to the kernel PATH_MAX bytes with its terminating NUL. Bytes, not characters: "é" is 2 bytes in UTF-8, "東" 3.
NAME_MAX = 255
PATH_MAX = 4096
_TOKEN_BYTES = 8  # the random part of a temporary name, written as 16 hex digits


def temp_name(name: str) -> str:
    """The hidden name a file is written under before it takes `name`: `.{name}.{16 hex digits}.tmp`."""
    return f".{name}.{secrets.token_hex(_TOKEN_BYTES)}.tmp"


def too_long(root: str | Path, key: str) -> TooLong | None:
    """How `key` under `root` overflows the file system, or None: each folder name, the temporary name of the file
    (the longest name written for it) and the whole path of that temporary file."""
    *folders, name = check_key(key).split("/")
    temp = f".{name}.{'0' * 2 * _TOKEN_BYTES}.tmp"
    path = f"{os.path.abspath(root).rstrip('/')}/{'/'.join(folders + [temp])}"
    names = [("folder name", part, NAME_MAX) for part in folders]
    names += [("temporary file name", temp, NAME_MAX), ("path", path, PATH_MAX - 1)]
    # Measured first, described only when over: a manifest of 100,000 videos checks every one.
    return worst([TooLong(f"{what} {quoted(text)}", size, limit) for what, text, limit in names
                  if (size := utf8_len(text)) > limit])


class LocalStore(Store):
    """Only the MP4 is written: metadata and checksums belong to the database, so no sidecar files."""

    def __init__(self, root: str | Path) -> None:
        # Fixed at open time, so a later chdir does not move the store.
        self.root = Path(os.path.abspath(os.path.expanduser(root)))

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def put(
        self, key: str, data: bytes, *, sha256: str, content_type: str = "video/mp4", metadata: dict[str, str]
    ) -> StoredObject:
        sha256 = check_sha256(sha256)
        path = self._path(key, writing=True)
        try:
            if path.exists():
                return self._resolve_existing(key, path, sha256)
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write the whole file under a hidden temporary name in the same folder, then hard-link it into place:
            # link() fails if the name exists, so it is an atomic create-if-absent, and readers never see half a file.
            tmp = path.parent / temp_name(path.name)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)
                except FileExistsError:  # a concurrent writer got there first
                    return self._resolve_existing(key, path, sha256)
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(path.parent)  # make the new name itself durable, not just the bytes
            # Read back what the filesystem now holds; a mismatch means the caller's bytes and checksum disagree
            # or the write was mangled. Either way the object must not stay.
            actual = _hash_file(path)
            if actual != sha256:
                path.unlink(missing_ok=True)
                raise IntegrityError(
                    f"{self.uri_for(key)}: stored bytes hash to sha256 {actual}, expected {sha256}; object deleted"
                )
            return StoredObject(uri=self.uri_for(key), key=key, bytes=len(data), sha256=sha256, existed=False)
        except OSError as exc:
            raise _store_error(exc, self.uri_for(key)) from exc

    def uri_for(self, key: str) -> str:
        # The path itself, not percent-encoded (Path.as_uri): the form an output URI is written in, so a video's URI
        # is its run's output prefix followed by its key, byte for byte.
        return f"file://{self._path(key)}"

    def too_long(self, key: str) -> TooLong | None:
        return too_long(self.root, key)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size  # of the file opened, so a rename cannot swap it after the check
                if max_bytes is not None and size > max_bytes:
                    raise ObjectTooLarge(f"{self.uri_for(key)} is {size:,} bytes, over the {max_bytes:,}-byte limit")
                data = f.read(size + 1)  # one byte more tells a file that grew since the check
            if max_bytes is not None and len(data) > max_bytes:
                raise ObjectTooLarge(f"{self.uri_for(key)} grew past the {max_bytes:,}-byte limit while read")
            return data
        except IsADirectoryError as exc:
            raise ObjectNotFound(f"no object at {self.uri_for(key)}: it is a folder") from exc
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"no object at {self.uri_for(key)}") from exc
        except OSError as exc:
            raise _store_error(exc, self.uri_for(key)) from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def path(self, key: str) -> Path:
        """The file at `key` (checked as every key is), for a server to stream it rather than read it whole."""
        return self._path(key)

    def stat(self, key: str) -> StoredObject | None:
        path = self._path(key)
        try:
            return StoredObject(uri=self.uri_for(key), key=key, bytes=path.stat().st_size, sha256=_hash_file(path),
                                existed=True)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _store_error(exc, self.uri_for(key)) from exc

    def replace(self, key: str, data: bytes, *, content_type: str) -> str:
        path = self._path(key, writing=True)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / temp_name(path.name)
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise _store_error(exc, self.uri_for(key)) from exc
        return self.uri_for(key)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise _store_error(exc, self.uri_for(key)) from exc

    def _path(self, key: str, *, writing: bool = False) -> Path:
        path = self.root / check_key(key)
        # check_key already rules out '..' and absolute keys; this guards the rule itself.
        if os.path.commonpath([self.root, path]) != str(self.root):
            raise ValueError(f"store key {key!r} escapes the store root {self.root}")
        over = too_long(self.root, key) if writing else None
        if over is not None:  # said plainly, before any folder is made, rather than as ENAMETOOLONG half-way
            raise KeyTooLong(f"{self.uri_for(key)}: {over}")
        return path

    def _resolve_existing(self, key: str, path: Path, sha256: str) -> StoredObject:
        existing = _hash_file(path)
        if existing != sha256:
            raise ObjectConflict(
                # Not the existing object's hash: the message reaches whoever submitted, who may not own it.
                f"{self.uri_for(key)} already holds different bytes; refusing to overwrite it with sha256 {sha256}"
            )
        return StoredObject(
            uri=self.uri_for(key), key=key, bytes=path.stat().st_size, sha256=sha256, existed=True
        )


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _store_error(exc: OSError, uri: str) -> StoreError:
    kind = StoreUnavailable if exc.errno in _TRANSIENT_ERRNOS else StoreError
    return kind(f"{uri}: {exc.strerror or exc}")
