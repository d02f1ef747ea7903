"""Quality gates for the levers past exact mode: the lossy accelerators (EngineConfig.step_cache, guidance_fraction,
step_scale), 8-bit attention kernels (EngineConfig.attention "sage"...), a precision below native
(engine.levers.precision: setting `precision=MODE`, alone or after the accelerators' key), and distilled registrations.

A lever trades output for speed, so no worker uses one on faith: `reelbatch bench quality` renders a sample (the toy
world's judged set, the user's own manifest, or the shipped prompt set; jobs.quality.prompts) in exact mode and with the
lever, and records here whether the lever stayed faithful to exact mode on the same prompts and seeds (the rules and
their thresholds: engine.levers.gate_rules): the set's mean PSNR at MIN_PSNR_DB or more, every video's SSIM at
SSIM_FLOOR or more, and, where a judge reads the prompts (the toy world), adherence within ADHERENCE_POINTS of exact
mode's. The engine loads a model with a lever only when a passing record of at least MIN_SAMPLE videos exists for that
model's content key (engine.levers.content_key.gate_key: the SHA-256 of every file it covers) and that exact setting
(EngineConfig.lossy()).

A distilled registration (one naming a `teacher`: a few-step, guidance-free student) is another model, not a
same-trajectory lever, so its gate (setting DISTILLED) asks other things of it against the teacher on the same
prompts and seeds (judge_distilled): flicker within FLICKER_RATIO of the teacher's, motion at least MOTION_RATIO of
it (a student that freezes fails), no more blank frames or frozen videos, and adherence: per attribute no more than
ADHERENCE_POINTS below the teacher's where the toy judge reads the prompts, else a CLIP score no more than
CLIP_MARGIN below the teacher's when the registration names a CLIP folder. Its PSNR against the teacher is recorded,
not required: another model draws other pixels from the same noise.

An 8-bit setting's record also holds its recipe (engine.levers.precision.recipe: the layers kept in float and torchao's
version), and releases nothing under another one.

Records live in one JSON file under the cache folder, written atomically, so every worker sharing the cache folder
sees the same gates. A record is made only by measuring; nothing else marks a model as checked.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import assert_never

import numpy as np

from engine.errors import RenderError
from engine.levers import precision
from engine.levers.gate_rules import Measured, judge_distilled

GATES_FILE = "quality-gates.json"
# The fewest videos a record may rest on to release a lever. Every video must pass the SSIM floor, so a record of n
# passing videos says, by the rule of three, that at most 3/n of a fleet's videos fall under it (95% confidence):
# 9.4% at 32, 37.5% at 8. And on the toy world 32 videos hold every colour, shape, direction and background at
# least four times (jobs.quality.sample), so each attribute's adherence rests on more than one verdict per value.
MIN_SAMPLE = 32
# The setting a distilled registration's gate is recorded under.
DISTILLED = "distilled"


class UngatedSetting(RenderError):
    """A lossy setting was asked for on a model where no recorded gate passed, or a distilled registration was
    asked for whose distilled gate did not. `setting` is the one refused (DISTILLED for the latter)."""

    def __init__(self, message: str, setting: str):
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class Gate:
    model: str
    identity: str
    setting: str
    count: int
    batch: int
    speedup: float
    psnr_db_min: float
    psnr_db_mean: float
    ssim_min: float
    adherence: dict[str, float]  # empty where no judge reads the prompts
    exact_adherence: dict[str, float]
    measured_at: str
    failures: list[str] = field(default_factory=list)
    # The reference-free measures, its own and (teacher_*) the teacher's for a distilled registration's gate, exact
    # mode's for a lever's; and a distilled registration's teacher.
    teacher: str | None = None
    flicker: float | None = None
    teacher_flicker: float | None = None
    blank_frames: int | None = None
    teacher_blank_frames: int | None = None
    motion: float | None = None
    teacher_motion: float | None = None
    frozen_videos: int | None = None
    teacher_frozen_videos: int | None = None
    clip_score: float | None = None
    teacher_clip_score: float | None = None
    # Where the sample came from: "toy held-out draw, entropy N", "shipped prompts", or the manifest file's path.
    sample: str = ""
    # An 8-bit setting's recipe as measured (engine.levers.precision.recipe; None: this code's, the one the renders
    # used).
    recipe: str | None = None

    def __post_init__(self) -> None:
        if self.recipe is None:
            object.__setattr__(self, "recipe", precision.recipe(self.setting))

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def releases(self) -> bool:
        """Whether this record lets a worker use its lever: it passed, on at least MIN_SAMPLE videos."""
        return self.passed and self.count >= MIN_SAMPLE

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "releases": self.releases}


def distilled_gate(model: str, identity: str, teacher: str, *, adherence: dict[str, float],
                   teacher_adherence: dict[str, float], videos: list[np.ndarray], teacher_videos: list[np.ndarray],
                   batch: int, speedup: float, clip: float | None = None, teacher_clip: float | None = None,
                   sample: str = "") -> Gate:
    """A distilled registration's gate from its renders and its teacher's of the same sample (raw frames, the
    adherence judged as the caller judges it, e.g. after MP4, or {} where nothing judges it; the CLIP scores where a
    CLIP folder is registered): PSNR and SSIM against the teacher reported, the reference-free measures compared."""
    from engine.frames.metrics import psnr, ssim

    psnrs = [psnr(a, b) for a, b in zip(videos, teacher_videos)]
    ssims = [ssim(a, b) for a, b in zip(videos, teacher_videos)]
    mine, theirs = Measured.of(videos, clip), Measured.of(teacher_videos, teacher_clip)
    failures = judge_distilled(adherence, teacher_adherence, flicker_=mine.flicker, teacher_flicker=theirs.flicker,
                               blank=mine.blank, teacher_blank=theirs.blank, motion_=mine.motion,
                               teacher_motion=theirs.motion, frozen=mine.frozen, teacher_frozen=theirs.frozen,
                               clip=clip, teacher_clip=teacher_clip)
    return Gate(model=model, identity=identity, setting=DISTILLED, count=len(videos), batch=batch, speedup=speedup,
                psnr_db_min=float(min(psnrs)), psnr_db_mean=float(np.mean(psnrs)), ssim_min=float(min(ssims)),
                adherence=adherence, exact_adherence=teacher_adherence,
                measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), failures=failures,
                teacher=teacher, flicker=mine.flicker, teacher_flicker=theirs.flicker, blank_frames=mine.blank,
                teacher_blank_frames=theirs.blank, motion=mine.motion, teacher_motion=theirs.motion,
                frozen_videos=mine.frozen, teacher_frozen_videos=theirs.frozen, clip_score=clip,
                teacher_clip_score=teacher_clip, sample=sample)


def _path(cache_dir: Path) -> Path:
    return Path(cache_dir) / GATES_FILE


def load(cache_dir: Path) -> dict[str, dict]:
    """Every recorded gate, keyed "identity|setting"."""
    try:
        return json.loads(_path(cache_dir).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def record(cache_dir: Path, gate: Gate) -> None:
    """Store `gate`, replacing an earlier measurement of the same model and setting."""
    path = _path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    gates = load(cache_dir)
    gates[f"{gate.identity}|{gate.setting}"] = gate.to_dict()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".gates-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(gates, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


class GateState(Enum):
    """Where a model's gate for one setting stands (`state`); only PASSED lets a worker use it."""

    PASSED = "passed"
    NOT_MEASURED = "not measured"
    OTHER_RECIPE = "measured with another quantization"
    FAILED = "failed"
    TOO_FEW = "passed on too few videos"


def state(records: dict[str, dict], identity: str, setting: str) -> tuple[GateState, dict | None]:
    """The state of `setting`'s gate on the model of `identity` among `records` (`load`), and its record where one
    is kept. What `require` refuses by, and what `reelbatch models` shows, so the two cannot disagree."""
    found = records.get(f"{identity}|{setting}")
    if found is None:
        return GateState.NOT_MEASURED, None
    if found.get("recipe", "") != precision.recipe(setting):
        return GateState.OTHER_RECIPE, found
    if not found["passed"]:
        return GateState.FAILED, found
    if found["count"] < MIN_SAMPLE:
        return GateState.TOO_FEW, found
    return GateState.PASSED, found


def require(cache_dir: Path, model: str, identity: str, setting: str) -> dict:
    """The passing gate for `setting` on this model; else UngatedSetting saying what to run."""
    gate, found = state(load(cache_dir), identity, setting)
    if setting == DISTILLED:
        how = f"measure it against its teacher with `reelbatch bench quality --model {model}`"
        what = f"model {model!r}'s distilled quality gate"
    else:
        how = f"measure it with `{measure_command(model, setting)}`"
        what = f"lossy setting {setting}'s quality gate for model {model!r}"
    match gate:
        case GateState.PASSED:
            assert found is not None
            return found
        case GateState.NOT_MEASURED if setting == DISTILLED:
            message = (f"model {model!r} is distilled and has no recorded quality gate against its teacher (as its "
                       f"files are now): {how}")
        case GateState.NOT_MEASURED:
            message = (f"lossy setting {setting} has no recorded quality gate for model {model!r} (as its files are "
                       f"now): {how}, or turn it off")
        case GateState.OTHER_RECIPE:
            message = (f"{what} was measured with another quantization ({found.get('recipe') or 'unrecorded'}; now: "
                       f"{precision.recipe(setting)}): {how} again, or turn it off")
        case GateState.FAILED if setting == DISTILLED:
            message = (f"model {model!r} failed its distilled quality gate against its teacher "
                       f"({'; '.join(found['failures'])}); after changing its files, {how}")
        case GateState.FAILED:
            message = (f"lossy setting {setting} failed its quality gate for model {model!r} "
                       f"({'; '.join(found['failures'])}): turn it off or choose another setting")
        case GateState.TOO_FEW:
            message = (f"{what} passed on {found['count']} videos, under the {MIN_SAMPLE} a gate needs to release a "
                       f"lever: {how} on {MIN_SAMPLE} or more (--count, or --prompts with that many videos)")
        case _:
            assert_never(gate)
    raise UngatedSetting(message, setting)


def measure_command(model: str, setting: str) -> str:
    """The command that measures `setting`'s gate on `model`: a precision (engine.levers.precision, `precision=MODE`)
    goes to --precision, the lossy accelerators to --setting."""
    parts = setting.split(",")
    modes = [p.partition("=")[2] for p in parts if p.startswith("precision=")]
    others = ",".join(p for p in parts if not p.startswith("precision="))
    return (f"reelbatch bench quality --model {model}" + (f" --setting {others}" if others else "")
            + "".join(f" --precision {m}" for m in modes))
