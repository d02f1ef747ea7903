"""Where a run's objects live, written once: a video's key, a chunk checkpoint's key, the run's result files, and the
store for a prefix. A leaf below the manifest and the render: the manifest checks that a run's longest keys fit the
store (jobs.manifest.room), the render writes its objects at them (jobs.render), and the reports link them."""

from __future__ import annotations

from functools import lru_cache

from storage.poster import SUFFIX as POSTER_SUFFIX
from storage.stores import Store, open_store


@lru_cache(maxsize=64)
def store_for(prefix: str) -> Store:
    """One store per output prefix per process (an S3 client is reused across batches)."""
    return open_store(prefix)


def object_key(run_name: str, video_key: str) -> str:
    """Deterministic: the same video always lands on the same key, so a retry can never make a second object."""
    return f"{run_name}/{video_key}.mp4"


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
