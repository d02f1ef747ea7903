"""Quality gates for the lossy accelerators (EngineConfig.step_cache, guidance_fraction, step_scale) and for a
precision below native (engine.precision: setting `precision=MODE`, alone or after the accelerators' key).

A lossy setting trades output for speed, so no worker uses one on faith: `reelbatch bench --quality` renders the
model's fixed sample set in exact mode and with the setting, and records here whether the setting kept prompt
adherence within ADHERENCE_POINTS of exact mode and its frames at MIN_PSNR_DB or more (the mean over the set, as
step-caching papers report it; the minimum is recorded beside it) against the exact renders.
The engine loads a model with a lossy setting only when a passing record exists for that model's identity (all its
files' names, sizes and modification times) and that exact setting; a changed model needs measuring again.

A distilled registration (one naming a `teacher`: a few-step, guidance-free student) is another model, not a lossy
setting, so its gate (setting DISTILLED) asks other things: prompt adherence per attribute no more than
ADHERENCE_POINTS below the teacher's on the same sample set, no more blank frames than the teacher's, and flicker
within FLICKER_RATIO of the teacher's (judge_distilled). Its PSNR against the teacher is recorded, not required:
another model draws other pixels from the same noise. The engine loads a distilled registration only when a
passing DISTILLED record exists for its identity (engine.adapt.identity: the folder, its adapters, sampler and
decoder).

Records live in one JSON file under the cache folder, written atomically, so every worker sharing the cache folder
sees the same gates.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from engine.errors import RenderError

GATES_FILE = "quality-gates.json"
# Adherence may drop by at most this much (2 points) on any judged attribute, and the set's mean PSNR against the
# exact renders must reach this.
ADHERENCE_POINTS = 0.02
MIN_PSNR_DB = 25.0
# The setting a distilled registration's gate is recorded under.
DISTILLED = "distilled"
# Flicker: the mean absolute change between consecutive frames, in uint8 levels over every pixel and channel, averaged
# over the set (engine.gates.flicker). A student may flicker at most this many times its teacher's on the same
# prompts and seeds. Measured on the toy model (80 videos each, docs/TOY_TRAINING.md, toy-fast): the teacher's own
# flicker is 13.2 on the quality set and 12.9 on 80 other seeds (3% apart); the 4-step student decoded by the VAE,
# 13.1 (0.99x); the same student through a light decoder trained without any temporal term, 17.5 and 16.8 (1.31x),
# a shimmer on the object's edges. 1.25 lets a student move as much as seeds do, several times over, and stops that.
FLICKER_RATIO = 1.25
# A frame is blank when its pixels' standard deviation (uint8 levels, every channel) is below this: a flat field.
# The toy world's frames, an object on a plain background, have 40 or more; Wan frames far more.
BLANK_STD = 2.0


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
    adherence: dict[str, float]
    exact_adherence: dict[str, float]
    measured_at: str
    failures: list[str] = field(default_factory=list)
    # A distilled registration's gate: its teacher, and flicker and blank frames, its own and the teacher's.
    teacher: str | None = None
    flicker: float | None = None
    teacher_flicker: float | None = None
    blank_frames: int | None = None
    teacher_blank_frames: int | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def judge(adherence: dict[str, float], exact: dict[str, float], psnr_db_mean: float) -> list[str]:
    """Why a setting fails its gate (nothing when it passes)."""
    failures = [f"{name} adherence {adherence[name]:.1%} is more than {ADHERENCE_POINTS:.0%} below exact mode's "
                f"{exact[name]:.1%}" for name in exact if adherence[name] < exact[name] - ADHERENCE_POINTS - 1e-9]
    if psnr_db_mean < MIN_PSNR_DB:
        failures.append(f"mean PSNR against the exact renders is {psnr_db_mean:.1f} dB (at least {MIN_PSNR_DB:g} "
                        f"dB required)")
    return failures


def flicker(videos: list[np.ndarray]) -> float:
    """The mean absolute change between consecutive frames (uint8 levels, every pixel and channel), averaged over
    the videos: what a viewer sees as shimmer on top of the motion, which the teacher's renders of the same prompts
    and seeds share."""
    return float(np.mean([np.abs(np.diff(v.astype(np.float32), axis=0)).mean() for v in videos]))


def blank_frames(videos: list[np.ndarray]) -> int:
    """How many frames of the videos are flat fields (pixel standard deviation below BLANK_STD)."""
    return int(sum((v.reshape(len(v), -1).std(axis=1) < BLANK_STD).sum() for v in videos))


def judge_distilled(adherence: dict[str, float], teacher: dict[str, float], *, flicker_: float,
                    teacher_flicker: float, blank: int, teacher_blank: int) -> list[str]:
    """Why a distilled registration fails its gate against its teacher (nothing when it passes). Each judged
    attribute counts; `all_four` (all of them at once) is reported, not gated: the issue's rule is per attribute."""
    failures = [f"{name} adherence {adherence[name]:.1%} is more than {ADHERENCE_POINTS:.0%} below the teacher's "
                f"{teacher[name]:.1%}" for name in teacher
                if name != "all_four" and adherence[name] < teacher[name] - ADHERENCE_POINTS - 1e-9]
    if blank > teacher_blank:
        failures.append(f"{blank} blank frames (the teacher: {teacher_blank})")
    if flicker_ > FLICKER_RATIO * teacher_flicker:
        failures.append(f"flicker {flicker_:.2f} is over {FLICKER_RATIO:g}x the teacher's {teacher_flicker:.2f}")
    return failures


def distilled_gate(model: str, identity: str, teacher: str, *, adherence: dict[str, float],
                   teacher_adherence: dict[str, float], videos: list[np.ndarray], teacher_videos: list[np.ndarray],
                   batch: int, speedup: float) -> Gate:
    """A distilled registration's gate from its renders and its teacher's of the same sample set (raw frames, the
    adherence judged as the caller judges it, e.g. after MP4): PSNR and SSIM against the teacher reported, flicker
    and blank frames compared."""
    from engine.metrics import psnr, ssim

    psnrs = [psnr(a, b) for a, b in zip(videos, teacher_videos)]
    ssims = [ssim(a, b) for a, b in zip(videos, teacher_videos)]
    measured = {"flicker_": flicker(videos), "teacher_flicker": flicker(teacher_videos),
                "blank": blank_frames(videos), "teacher_blank": blank_frames(teacher_videos)}
    return Gate(model=model, identity=identity, setting=DISTILLED, count=len(videos), batch=batch, speedup=speedup,
                psnr_db_min=float(min(psnrs)), psnr_db_mean=float(np.mean(psnrs)), ssim_min=float(min(ssims)),
                adherence=adherence, exact_adherence=teacher_adherence,
                measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                failures=judge_distilled(adherence, teacher_adherence, **measured), teacher=teacher,
                flicker=measured["flicker_"], teacher_flicker=measured["teacher_flicker"],
                blank_frames=measured["blank"], teacher_blank_frames=measured["teacher_blank"])


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


def require(cache_dir: Path, model: str, identity: str, setting: str) -> dict:
    """The passing gate for `setting` on this model; else UngatedSetting saying what to run."""
    found = load(cache_dir).get(f"{identity}|{setting}")
    if setting == DISTILLED:
        how = f"measure it against its teacher with `reelbatch bench --quality --model {model}`"
        if found is None:
            raise UngatedSetting(f"model {model!r} is distilled and has no recorded quality gate against its teacher "
                                 f"(as its files are now): {how}", setting)
        if not found["passed"]:
            raise UngatedSetting(f"model {model!r} failed its distilled quality gate against its teacher "
                                 f"({'; '.join(found['failures'])}); after changing its files, {how}", setting)
        return found
    how = f"measure it with `{measure_command(model, setting)}`"
    if found is None:
        raise UngatedSetting(f"lossy setting {setting} has no recorded quality gate for model {model!r} (as its "
                             f"files are now): {how}, or turn it off", setting)
    if not found["passed"]:
        raise UngatedSetting(f"lossy setting {setting} failed its quality gate for model {model!r} "
                             f"({'; '.join(found['failures'])}): turn it off or choose another setting", setting)
    return found


def measure_command(model: str, setting: str) -> str:
    """The command that measures `setting`'s gate on `model`: a precision (engine.precision, `precision=MODE`) goes
    to --precision, the lossy accelerators to --setting."""
    parts = setting.split(",")
    modes = [p.partition("=")[2] for p in parts if p.startswith("precision=")]
    others = ",".join(p for p in parts if not p.startswith("precision="))
    return (f"reelbatch bench --quality --model {model}" + (f" --setting {others}" if others else "")
            + "".join(f" --precision {m}" for m in modes))
