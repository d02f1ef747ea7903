"""A run's outputs fetched to a local folder: each succeeded video's MP4 (checked against the SHA-256 the database
recorded when the worker stored it), its poster, and the run's results.jsonl and errors.jsonl, from the store the run
wrote them to (its `output`: a local folder or S3). What `reelbatch download` does.

The folder gets the run's layout without the run's name: `DIR/{video id}.mp4`, `DIR/{video id}.jpg`,
`DIR/results.jsonl`, `DIR/errors.jsonl`. Each file is written under a hidden temporary name beside its final one and
renamed only once its bytes are checked, so a file under a final name is always whole and right; a file already there
with the right bytes is left alone (a second download writes nothing). Posters and result files have no checksum in
the database: the store's bytes are the reference for them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from jobs.db import queries
from jobs.db.rows import Video
from jobs.db.status import Status
from jobs.errors import ReelbatchError, UsageError
from jobs.manifest.keys import object_key, poster_key, result_keys
from jobs.settings import Settings
from jobs.usecases.database import read_factory
from jobs.usecases.feedback import SILENT, Feedback
from storage.base import check_key, sha256_hex
from storage.local import temp_name
from storage.stores import ObjectNotFound, StoreError, open_store


class ChecksumMismatch(ReelbatchError):
    """An object's bytes do not hash to the SHA-256 the database recorded for it: nothing was written for it."""


class MissingObject(ReelbatchError):
    """The database says a video was stored, but its store holds no object at its key."""


@dataclass(frozen=True)
class Download:
    """What a download did: the files it wrote and those already right in the folder (names relative to it), and the
    run's videos that have no MP4 to fetch, by status (pending, running, failed, cancelled)."""

    run: str
    folder: Path
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: dict[str, int] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)  # result files the store does not hold (yet)

    @property
    def finished(self) -> bool:
        """The run has no pending or running video: what it will ever store is here."""
        return not (self.missing.get("pending") or self.missing.get("running"))


def download(settings: Settings, run: str, folder: Path, feedback: Feedback = SILENT) -> Download:
    """Fetch run `run`'s (name or id) outputs into `folder` (made if absent). RunNotFound for an unknown run;
    UsageError for a store that cannot be reached or a folder that cannot be written; ChecksumMismatch or
    MissingObject for a stored video whose object is not what the database recorded."""
    factory = read_factory(settings)
    row = queries.find_run(factory, run)
    with factory() as s:
        videos = s.execute(select(Video.key, Video.status, Video.sha256, Video.poster_uri)
                           .where(Video.run_id == row.id).order_by(Video.id)).all()
    try:
        store = open_store(row.output)
    except (ValueError, StoreError) as exc:
        raise _unreachable(row.name, row.output, exc) from None
    states = [Status(status) for _, status, _, _ in videos]
    missing = {st.value: n for st in Status if st is not Status.SUCCEEDED and (n := states.count(st))}
    found = Download(row.name, folder, missing=missing)
    stored = [(key, sha, poster) for key, status, sha, poster in videos if Status(status) is Status.SUCCEEDED]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"DIR: cannot make {folder}: {exc.strerror}") from None
    try:
        with feedback.count(f"downloading run {row.name}", len(stored)) as advance:
            for key, sha, poster in stored:
                mp4 = f"{check_key(key)}.mp4"
                _fetch(store, object_key(row.name, key), folder, mp4, sha, found)
                if poster:
                    jpg = poster_key(row.name, key).removeprefix(f"{row.name}/")
                    _fetch(store, poster_key(row.name, key), folder, jpg, None, found)
                advance(1)
        for full in result_keys(row.name):
            try:
                _fetch(store, full, folder, full.removeprefix(f"{row.name}/"), None, found)
            except ObjectNotFound:  # written when the run's last video ends (jobs.reports.results)
                found.absent.append(full.removeprefix(f"{row.name}/"))
    except ObjectNotFound as exc:
        raise MissingObject(f"run {row.name}: the database records a stored video, but {exc}") from None
    except StoreError as exc:  # StoreUnavailable among them: an endpoint down, a bucket gone, access denied
        raise _unreachable(row.name, row.output, exc) from None
    return found


def _unreachable(name: str, output: str, exc: Exception) -> UsageError:
    where = ("check AWS_ENDPOINT_URL and the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
             if output.lower().startswith("s3://") else "check that the folder is there and readable")
    return UsageError(f"the store of run {name} cannot be read (its output {output}, from the manifest's `output` "
                      f"or REELBATCH_OUTPUT): {exc}; {where}")


def _fetch(store, key: str, folder: Path, name: str, sha256: str | None, found: Download) -> None:
    """One object to `folder/name`: skipped when the file there already has the right bytes (the database's checksum
    for an MP4, the store's bytes otherwise); written through a temporary name and renamed once checked."""
    path = folder / name
    if sha256 is not None and _file_sha256(path) == sha256:
        found.skipped.append(name)
        return
    data = store.get(key)
    got = sha256_hex(data)
    if sha256 is not None and got != sha256:
        raise ChecksumMismatch(f"run {found.run}: {store.uri_for(key)} has sha256 {got}, but the database recorded "
                               f"{sha256}; not written")
    if sha256 is None and _file_sha256(path) == got:
        found.skipped.append(name)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / temp_name(path.name)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            # Read back: what is renamed into place is what was checked, not only what was meant to be written.
            written = _file_sha256(tmp)
            if written != got:
                raise ChecksumMismatch(f"run {found.run}: {tmp} read back with sha256 {written}, written as {got}; "
                                       "not renamed")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise UsageError(f"DIR: cannot write {path}: {exc.strerror}") from None
    found.written.append(name)


def _file_sha256(path: Path) -> str | None:
    """The file's SHA-256, or None when there is no file."""
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
