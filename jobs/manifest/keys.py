"""Where a run's objects live, written once: a video's key, a chunk checkpoint's key, and the store for a prefix; and
whether the MP4 at a video's key is the one an earlier attempt of it recorded."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from storage.poster import SUFFIX as POSTER_SUFFIX
from storage.stores import Store, StoredObject, open_store

if TYPE_CHECKING:
    from jobs.work.claims import ClaimedUnit


@lru_cache(maxsize=64)
def store_for(prefix: str) -> Store:
    """One store per output prefix per process (an S3 client is reused across batches)."""
    return open_store(prefix)


def object_key(run_name: str, video_key: str) -> str:
    """Deterministic: the same video always lands on the same key, so a retry can never make a second object."""
    return f"{run_name}/{video_key}.mp4"


def earlier_upload(unit: ClaimedUnit) -> StoredObject | None:
    """The object at the video's key if it is the one an earlier attempt recorded just before uploading it (its
    checksum is the unit's upload_sha256): that attempt's MP4, to adopt rather than render or store again. None when
    no checksum was recorded (the store is not asked) or the key holds nothing or something else. StoreError when
    the store cannot be asked."""
    if not unit.upload_sha256:
        return None
    found = store_for(unit.output).stat(object_key(unit.run_name, unit.key))
    return found if found is not None and found.sha256 == unit.upload_sha256 else None


def poster_key(run_name: str, video_key: str) -> str:
    """The video's poster (storage.poster), beside its MP4: as deterministic, and as write-once."""
    return f"{run_name}/{video_key}{POSTER_SUFFIX}"


def checkpoint_key(run_name: str, video_key: str, chunk: int, token: int) -> str:
    """Where a long video's chunk latents wait for the next chunk and the stitch: beside the run's videos, in a
    scratch folder, one object per attempt (the lease token), so a retried chunk never conflicts with a lost
    attempt's object."""
    return f"_chunks/{run_name}/{video_key}/{chunk}-{token}.safetensors"


def result_keys(run_name: str) -> tuple[str, str]:
    """The run's result files, beside its videos: results.jsonl and errors.jsonl (jobs.reports.results)."""
    return f"{run_name}/results.jsonl", f"{run_name}/errors.jsonl"


# The largest lease token (a BIGINT column): a checkpoint key under it is the longest a chunk can have.
_MAX_TOKEN = 2**63 - 1


def longest_video_keys(run_name: str, video_key: str, chunks: int) -> tuple[str, ...]:
    """The longest keys a video's objects can have: its MP4 and, for a long video, its last chunk's checkpoint; what
    must fit the store before the video is accepted (jobs.manifest.room)."""
    keys = (object_key(run_name, video_key),)
    return keys + (checkpoint_key(run_name, video_key, chunks - 1, _MAX_TOKEN),) if chunks > 1 else keys
