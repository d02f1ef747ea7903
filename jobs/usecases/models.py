"""Every model a manifest may name, as this process's settings register it: the built-ins and each entry of the
operator's models file (REELBATCH_MODELS), with where it comes from, its folder, family and native defaults, how it
renders (precision, adapters, a picture to start from) and, where a gate applies, its gate's state. What
`reelbatch models` answers.

A gate applies to a distilled registration (one naming a teacher: setting "distilled") and to a model rendered with
lossy settings: this process's lossy accelerators and a precision below native. The device is not known here, so a
precision counts as lossy when it is on every device (fp16 and the 8-bit modes; bf16 is native on a GPU), as at
submit. The state is engine.levers.gates.state, the same function a worker refuses by.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.levers import content_key, gates, precision
from engine.models.registry import ModelInfo
from engine.models.tiny import builtin_folder
from jobs.settings import Settings

BUILT_IN = "built-in"


@dataclass(frozen=True)
class Defaults:
    """What a manifest inherits for fields it leaves out (engine.models.registry.ModelDefaults), with the frame count a
    video of that duration and rate renders (the model's 4k+1 rule applied)."""

    width: int
    height: int
    fps: int
    duration_s: float
    frames: int
    steps: int
    guidance: float


@dataclass(frozen=True)
class AdapterEntry:
    path: str
    scale: float
    expert: str


@dataclass(frozen=True)
class GateEntry:
    setting: str  # "distilled", or the lossy key a worker checks ("precision=int8")
    state: str  # engine.levers.gates.GateState's value: passed, not measured, failed, ...


@dataclass(frozen=True)
class Model:
    name: str
    source: str  # "built-in", or FILE:LINE of its entry in the models file
    path: str  # its diffusers folder (a built-in one is built there on first use)
    family: str  # engine.models.families
    defaults: Defaults
    precision: str  # the mode it renders at with these settings (engine.levers.precision; auto: the device's native)
    text_encoder_precision: str | None  # None: as the pipeline
    adapters: list[AdapterEntry]
    image_condition: str | None  # None: it takes no picture
    teacher: str | None
    gates: list[GateEntry]  # empty: no gate applies

    def to_dict(self) -> dict:
        return asdict(self)


def list_models(settings: Settings) -> list[Model]:
    """Every registered model, by name; a broken models file is a UsageError naming it (Settings.registry)."""
    registry = settings.registry()
    cache_dir = settings.engine.cache_dir
    records = gates.load(cache_dir)
    listed = []
    for name in registry.names():
        info = registry.get(name)
        folder = builtin_folder(cache_dir, name) if info.builtin else info.path
        assert folder is not None  # a registration from the models file always has a path
        mode = precision.mode_for(settings.engine.precision, info.precision)
        text_mode = precision.text_encoder_mode(settings.engine.text_encoder_precision, info.text_encoder_precision)
        needed = [gates.DISTILLED] if info.teacher else []
        lossy = precision.gate_setting(settings.engine.lossy(), mode, None, text_mode)
        needed += [lossy] if lossy else []
        d = info.defaults
        listed.append(Model(
            name=name, source=registry.sources.get(name, BUILT_IN), path=str(folder), family=info.family,
            defaults=Defaults(d.width, d.height, d.fps, d.duration_s, _frames(info), d.steps, d.guidance),
            precision=mode, text_encoder_precision=text_mode,
            adapters=[AdapterEntry(str(a.path), a.scale, a.expert) for a in info.adapters],
            image_condition=info.image_condition, teacher=info.teacher,
            gates=[GateEntry(s, _state(records, cache_dir, info, folder, s).value) for s in needed]))
    return listed


def _frames(info: ModelInfo) -> int:
    # As a manifest's video gets them (jobs.manifest.fields): duration x fps rounded half up, then the 4k+1 rule.
    return info.valid_frames(math.floor(info.defaults.duration_s * info.defaults.fps + 0.5))


def _state(records: dict[str, dict], cache_dir: Path, info: ModelInfo, folder: Path, setting: str) -> gates.GateState:
    """engine.levers.gates.state of `setting` on this registration. Its key is the SHA-256 of its files (cached beside
    the records once computed), read only where some record of `setting` exists: with none, it is not measured."""
    if not any(key.endswith(f"|{setting}") for key in records) or not folder.is_dir():
        return gates.GateState.NOT_MEASURED
    identity = content_key.gate_key(info, folder, content_key.FileDigests(cache_dir))
    return gates.state(records, identity, setting)[0]
