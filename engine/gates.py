"""Quality gates for the lossy accelerators (EngineConfig.step_cache, guidance_fraction, step_scale).

A lossy setting trades output for speed, so no worker uses one on faith: `reelbatch bench --quality` renders the
model's fixed sample set in exact mode and with the setting, and records here whether the setting kept prompt
adherence within ADHERENCE_POINTS of exact mode and its frames at MIN_PSNR_DB or more (the mean over the set, as
step-caching papers report it; the minimum is recorded beside it) against the exact renders.
The engine loads a model with a lossy setting only when a passing record exists for that model's identity (all its
files' names, sizes and modification times) and that exact setting; a changed model needs measuring again.

Records live in one JSON file under the cache folder, written atomically, so every worker sharing the cache folder
sees the same gates.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.errors import RenderError

GATES_FILE = "quality-gates.json"
# Adherence may drop by at most this much (2 points) on any judged attribute, and the set's mean PSNR against the
# exact renders must reach this.
ADHERENCE_POINTS = 0.02
MIN_PSNR_DB = 25.0


class UngatedSetting(RenderError):
    """A lossy setting was asked for on a model where no recorded gate passed."""


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
    how = f"measure it with `reelbatch bench --quality --model {model} --setting {setting}`"
    if found is None:
        raise UngatedSetting(f"lossy setting {setting} has no recorded quality gate for model {model!r} (as its "
                             f"files are now): {how}, or turn it off")
    if not found["passed"]:
        raise UngatedSetting(f"lossy setting {setting} failed its quality gate for model {model!r} "
                             f"({'; '.join(found['failures'])}): turn it off or choose another setting")
    return found
