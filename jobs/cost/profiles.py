"""Benchmark profiles: what `reelbatch bench` measured a model rendering, kept for estimates (jobs.cost.estimate) to
use before the ledger has any history of that model.

One file, `REELBATCH_CACHE_DIR/profiles.json`: a model name -> the shape the bench rendered, the worker path's seconds
per video there (its wall time over its videos: batched, stored, recorded, as a worker renders), the device and when.
The bench records one each time it runs its side by side, under the preset's model or `--profile-as NAME` (a
registered model of the same architecture, such as real Wan weights measured through the random-weight preset).

Beneath it, the profiles reelbatch ships for its built-in models (shipped_profiles.json beside this module, measured
by scripts/measure_profiles.py on the machine its entries name), so that a fresh database's estimate has a basis; a
profile the user's bench recorded under the same name takes their place.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from jobs.errors import UsageError

FILE = "profiles.json"
SHIPPED = Path(__file__).with_name("shipped_profiles.json")


@dataclass(frozen=True)
class Profile:
    model: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    seconds_per_video: float
    videos: int
    batch: int
    device: str
    measured_at: str  # ISO 8601, UTC
    source: str  # the command that measured it
    shipped: bool = False  # one of reelbatch's own (SHIPPED), not measured on this machine


def load(cache_dir: Path, shipped: bool = True) -> dict[str, Profile]:
    """Every profile by model name: the shipped ones (unless `shipped` is false: a budget's gate spends only on
    what was measured on the user's own machines), then those recorded in `cache_dir` over them."""
    return {**(_read(SHIPPED, shipped=True) if shipped else {}), **_read(Path(cache_dir) / FILE)}


def _read(path: Path, shipped: bool = False) -> dict[str, Profile]:
    """The file's profiles by model name; none when it is missing. A file that is not a profiles file is a usage
    error naming it (the estimate would otherwise quietly lose its basis)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read the bench profiles ({exc}); delete it or run `reelbatch bench` again"
                         ) from None
    names = {f.name for f in fields(Profile)} - {"shipped"}
    try:
        return {model: Profile(**{k: v for k, v in entry.items() if k in names}, shipped=shipped)
                for model, entry in data.items()}
    except (TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a bench profiles file ({exc}); delete it or run `reelbatch bench` again"
                         ) from None


def record(cache_dir: Path, profile: Profile) -> Path:
    """Add or replace the model's profile; the file is replaced whole (a reader never sees half of it)."""
    path = Path(cache_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    profiles = {name: as_entry(p) for name, p in _read(path).items()}
    profiles[profile.model] = as_entry(profile)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".profiles-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(profiles, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def as_entry(profile: Profile) -> dict:
    return {k: v for k, v in asdict(profile).items() if k != "shipped"}
