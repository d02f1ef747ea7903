"""Memory envelopes as submit, estimate and `reelbatch envelopes` see them: a video that fits no recorded device's
envelope of its model is refused before anything is written (jobs.db.envelopes, engine.models.envelope)."""

from __future__ import annotations

from pathlib import Path

from engine.models.envelope import Envelope, tokens
from engine.models.shape_rules import rules_of
from jobs.db import envelopes as kept
from jobs.manifest.specs import ManifestError, ManifestIssue, RunSpec
from jobs.settings import Settings
from jobs.usecases.database import missing_file, read_factory

# A manifest's refusal lists at most this many videos (the rest are counted).
SHOWN = 20


def refuse(manifest: Path | str, issues: list[ManifestIssue], rest: str) -> None:
    """Raise ManifestError with the first SHOWN `issues` and a line counting the others ("and 3 more videos
    `rest`"); nothing when there are none."""
    if not issues:
        return
    shown, more = issues[:SHOWN], len(issues) - SHOWN
    if more > 0:
        shown.append(ManifestIssue(str(manifest), 0, "(file)", f"and {more} more videos {rest}"))
    raise ManifestError(shown)


def recorded(settings: Settings, model: str | None = None) -> list[Envelope]:
    """The envelopes kept in the settings' database ([] when it does not exist yet)."""
    if missing_file(settings.database_url) is not None:
        return []
    return kept.load(read_factory(settings), model=model)


def check(settings: Settings, manifest: Path | str, spec: RunSpec) -> None:
    """Refuse a run with a video of which not one fits any device whose envelope of the run's model is recorded:
    ManifestError naming each such video's line, its shape and every device's limit. With no envelope recorded for
    the model (or REELBATCH_ENVELOPE=off) nothing is checked."""
    if settings.worker.envelope == "off":
        return
    found = recorded(settings, spec.model)
    if not found:
        return
    rules = rules_of(settings.registry().get(spec.model))
    issues, verdicts = [], {}
    for n, v in enumerate(spec.videos):
        size = (v.width, v.height, v.window or v.frames)
        if size not in verdicts:
            each = tokens(rules, *size)
            verdicts[size] = None if any(e.largest_batch(each, v.width, v.height) >= 1 for e in found) else each
        if verdicts[size] is not None:
            issues.append(ManifestIssue(str(manifest), v.line, f"videos[{n}].resolution",
                                        _message(spec.model, found, size, verdicts[size])))
    refuse(manifest, issues, "that fit no device")


def _message(model: str, found: list[Envelope], size: tuple[int, int, int], each: int) -> str:
    width, height, frames = size
    limits = "; ".join(
        f"{e.device}: at most {_gib(e.budget_bytes)} for a batch ({1 - e.spare:.0%} of {_gib(e.memory_bytes)} less "
        f"{_gib(e.resident_bytes)} resident), one video needs {_gib(e.predict(1, each, width, height))}"
        for e in found)
    return (f"{width}x{height}, {frames} frames a pass ({each:,} latent tokens) fits no device {model}'s memory "
            f"envelope is measured on: {limits}; make it smaller or shorter, or add a device with more memory "
            "(`reelbatch bench envelope`)")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
