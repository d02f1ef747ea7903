"""What a manifest becomes once checked: frozen specs of the run and its videos, or one error listing every problem
with its file, line, field and value."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from engine.types import stable_seed
from jobs.errors import UsageError
from storage.codecs import DEFAULT, Encoding


@dataclass(frozen=True)
class ManifestIssue:
    """One problem. `line` is 1-based; 0 means the file as a whole or a keyword argument (`--set`, `--model`)."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        if self.line:
            return f"{self.file}:{self.line}: {self.field}: {self.message}"
        # Not on a line, so no `FILE:0:` that would send the reader to a line that is not there. An option
        # (`--model`) or a setting (`REELBATCH_OUTPUT`) names itself: the problem is in what was typed or set.
        if self.field.startswith("--") or self.field.isupper():
            return f"{self.field}: {self.message}"
        if self.field == "(file)":
            return f"{self.file}: {self.message}"
        return f"{self.file}: {self.field}: {self.message}"


class ManifestError(UsageError):
    """Every problem found in one manifest, in line order; str() is one issue a line."""

    def __init__(self, issues: Sequence[ManifestIssue]):
        self.issues = list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(map(str, self.issues))


@dataclass(frozen=True)
class VideoSpec:
    id: str  # NFC-normalised
    line: int
    prompt: str
    negative_prompt: str | None
    seed: int | None  # None: derive_seed(run name, id) when the run is recorded
    width: int
    height: int
    frames: int  # what the model renders: nearest to duration x fps on its 4k+1 grid
    fps: int
    duration_s: float  # frames / fps, the length of the video actually made
    steps: int
    guidance: float
    requested_duration_s: float
    # Beyond the model's window: rendered as `chunks` units of `window` frames sharing `chunk_overlap` latents.
    chunks: int = 1
    window: int = 0  # frames per work unit: `frames` for a video within the window
    chunk_overlap: int = 0
    # The picture the video starts from (jobs.manifest.images): its canonical URI, the SHA-256 of its bytes at
    # submit, and how it meets the video's size. All None for a text-only video (and then left out of the content
    # hash, so text-only runs keep the hash they had before images existed).
    image: str | None = None
    image_sha256: str | None = None
    fit: str | None = None


@dataclass(frozen=True)
class RunSpec:
    name: str
    model: str
    output: str | None  # canonical (jobs.manifest.outputs): the file's, else the default's; None if neither was given
    priority: int  # 0-9, higher renders first
    source: str
    videos: tuple[VideoSpec, ...]
    content_sha256: str  # of everything but `source` (and video lines): same content, same hash
    notify: str | None = None  # a webhook URL under REELBATCH_ALLOWED_WEBHOOKS, POSTed to when the run finishes
    encoding: Encoding = DEFAULT  # codec, crf and preset of every video of the run
    max_cost_usd: float | None = None  # the run's cost cap (jobs.claims.gate)
    # UTC; a duration in the manifest (`PT10H`) is counted from when it was loaded. Its hash takes the form written.
    deadline: datetime | None = None
    # The model keeps videos that start from an image out of batches with text-only ones (ModelInfo.
    # mixed_image_batches false): their work units get a shape key of their own. From the registration, not the
    # manifest, so not part of the content hash.
    separate_image_batches: bool = False
    # What a video whose checks fail becomes (jobs.manifest.checks): flag, retry or fail.
    on_fail: str = "flag"


def derive_seed(run_name: str, video_id: str) -> int:
    """A seed for a video that names none: stable across machines and Python versions (no hash())."""
    return stable_seed(run_name, video_id)


class Report:
    """Collects a manifest's problems as they are found; `raise_any` raises them all at once, in line order."""

    # Past this many, a message a line stops helping (a JSON file named .yaml fails on every line): count the rest.
    LIMIT = 1000

    def __init__(self, file: str):
        self.file = file
        self.issues: list[ManifestIssue] = []
        self.more = 0

    def __call__(self, line: int, field: str, message: str) -> None:
        if len(self.issues) < self.LIMIT:
            self.issues.append(ManifestIssue(self.file, line, field, message))
        else:
            self.more += 1

    def raise_any(self) -> None:
        if self.issues:
            issues = sorted(self.issues, key=lambda issue: issue.line)
            if self.more:
                issues.append(ManifestIssue(self.file, 0, "(file)", f"{self.more:,} more problems not listed"))
            raise ManifestError(issues)
