"""Registered models: what a manifest may name, where the weights live, and the model's native defaults.

A manifest names a model; only the operator maps names to folders (the built-in `tiny`, plus a models file named by
`REELBATCH_MODELS`), so a manifest can never point a worker at an arbitrary path.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from engine.chunks import ChunkPlan, plan
from engine.errors import ModelNotFound

# The longest video: this many windows (Wan: 64 x ~4.75 s, about 5 minutes at 16 fps).
MAX_CHUNKS = 64


@dataclass(frozen=True)
class ModelDefaults:
    """What a manifest inherits for fields it leaves out."""

    width: int
    height: int
    fps: int
    duration_s: float
    steps: int
    guidance: float


@dataclass(frozen=True)
class ModelInfo:
    name: str
    defaults: ModelDefaults
    # Folder of a diffusers pipeline (model_index.json + safetensors). None for `tiny` until it is built.
    path: Path | None = None
    # Wan's VAE compresses time by 4, so a valid frame count is 4k+1; other counts are silently rounded by diffusers.
    temporal_factor: int = 4
    # Wan needs height and width in multiples of 16 (VAE 8x spatial, patch 2).
    spatial_multiple: int = 16
    # The window: the most frames one pass renders (what the model was trained on). A longer video is rendered as
    # chunks of this length sharing `chunk_overlap` latent frames (engine.chunks), at most MAX_CHUNKS of them.
    max_frames: int = 81
    chunk_overlap: int = 2
    # How a chunk's overlap is tied to the chunk before at each step: "noised" (the clean latents noised to the
    # step's level, inpainting-style; works with any model) or "clean" (held clean with timestep 0 on its tokens, as
    # diffusion forcing and LTX condition; for models trained to continue a clean prefix, like `toy`).
    chunk_condition: str = "noised"
    # WanPipeline.__call__ defaults to 512 text tokens but encode_prompt to 226: always pass it, and key caches on it.
    max_sequence_length: int = 512
    builtin: bool = False
    # How it takes a picture a video starts from (a manifest's `image`): None, it does not (the field is refused);
    # "first_frame", the picture VAE-encoded is the first latent frame, held clean with timestep 0 on its tokens, as
    # Wan 2.2 TI2V conditions (engine.first_frame); "pipeline", the pipeline's own image-to-video path, Wan 2.1 I2V's
    # image encoder and mask channels (engine.i2v), where every video needs a picture and fits one window.
    image_condition: str | None = None
    # Whether a video that starts from a picture may share a batch with text-only videos of its shape. A first_frame
    # model renders both in one loop (a text-only video's tokens get the step's timestep either way, and renders as
    # it does alone to within rounding, tested); false keeps them in batches of their own (Shape.image).
    mixed_image_batches: bool = True
    # A diffusers folder whose components fill in those `path` lacks: a fine-tune shipped as only the parts it
    # changed (`toy-i2v` is a transformer over `toy`'s folder).
    base: Path | None = None

    def chunk_plan(self, frames: int) -> ChunkPlan:
        """How a video of `frames` is rendered: one pass, or chunks of the window."""
        return plan(frames, self.max_frames, self.chunk_overlap, self.temporal_factor)

    def valid_frames(self, requested: int) -> int:
        """Round a frame count to the nearest count the model produces (`temporal_factor`*k + 1, k >= 1).

        Halfway cases round up. 16 frames at a factor of 4 gives 17; 14 gives 13; 15 gives 17.
        """
        k = math.floor((max(requested, 1) - 1) / self.temporal_factor + 0.5)
        return self.temporal_factor * max(k, 1) + 1


TINY = ModelInfo(
    name="tiny",
    # Small enough that a CPU renders a clip in about a second; random weights, so the video is noise.
    defaults=ModelDefaults(width=64, height=64, fps=8, duration_s=1.0, steps=4, guidance=5.0),
    temporal_factor=4,
    spatial_multiple=16,
    max_frames=33,
    max_sequence_length=64,
    builtin=True,
    image_condition="first_frame",
)

# `tiny`'s image-to-video sibling: diffusers' Wan 2.1 I2V architecture (engine.tiny.build_tiny_i2v_pipeline), random
# weights, for testing the pipeline path.
TINY_I2V = dataclasses.replace(TINY, name="tiny-i2v", image_condition="pipeline")

# The `toy` model, trained here on the toy world (engine.toy.train); registered once its weights are in this folder.
TOY_WEIGHTS = Path(__file__).resolve().parent / "toy" / "weights"
TOY = ModelInfo(
    name="toy",
    # Its native shape: trained on 9-frame 32x32 clips. Guidance 2 at 20 steps: on 80 prompt/seed pairs outside the
    # quality set, shape 79% at 2 against 71% at 4 and 66% at 5 (guidance rings at the edges and rounds squares),
    # direction 99% at 2 and 92.5% at 1.5 (docs/TOY_TRAINING.md). `reelbatch toy train` judges it here (its card).
    defaults=ModelDefaults(width=32, height=32, fps=8, duration_s=1.0, steps=20, guidance=2.0),
    path=TOY_WEIGHTS,
    # Its VAE compresses time by 2 and space by 4, and its patches are 2x2, so 8 would do; but WanPipeline.check_inputs
    # refuses sides that are not multiples of 16 whatever the VAE.
    temporal_factor=2,
    spatial_multiple=16,
    max_frames=9,
    max_sequence_length=64,
    chunk_condition="clean",
)

# `toy`'s transformer fine-tuned to start from a picture of the toy world (engine.toy.train_first_frame); the rest of
# the pipeline is `toy`'s, loaded from its folder. Registered once its transformer is in this folder.
TOY_I2V_WEIGHTS = Path(__file__).resolve().parent / "toy" / "weights-i2v"
TOY_I2V = dataclasses.replace(TOY, name="toy-i2v", path=TOY_I2V_WEIGHTS, base=TOY_WEIGHTS,
                              image_condition="first_frame")

# Wan2.1-T2V-1.3B's published defaults (832x480, 81 frames at 16 fps, 50 steps, guidance 5.0).
WAN_DEFAULTS = ModelDefaults(width=832, height=480, fps=16, duration_s=5.0, steps=50, guidance=5.0)

_DEFAULT_FIELDS = {f: type(getattr(WAN_DEFAULTS, f)) for f in ModelDefaults.__dataclass_fields__}


def builtin_models() -> dict[str, ModelInfo]:
    """`tiny` and `tiny-i2v` always; `toy` once its trained weights are in place (`reelbatch toy train --out
    engine/toy/weights`), and `toy-i2v` once its transformer is too (`reelbatch toy first-frame`)."""
    models = {"tiny": TINY, "tiny-i2v": TINY_I2V}
    if (TOY_WEIGHTS / "model_index.json").is_file():
        models["toy"] = TOY
        if (TOY_I2V_WEIGHTS / "transformer" / "config.json").is_file():
            models["toy-i2v"] = TOY_I2V
    return models


@dataclass
class Registry:
    """Name -> ModelInfo. Built-ins plus the operator's models file."""

    models: dict[str, ModelInfo] = field(default_factory=lambda: builtin_models())

    def get(self, name: str) -> ModelInfo:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(sorted(self.models))
            raise ModelNotFound(f"model {name!r} is not registered (registered: {known})") from None

    def __contains__(self, name: str) -> bool:
        return name in self.models

    def names(self) -> list[str]:
        return sorted(self.models)


def load_registry(models_file: Path | None = None) -> Registry:
    """The built-in models plus those in `models_file`, a YAML mapping such as::

        wan-1.3b:
          path: /models/Wan2.1-T2V-1.3B-Diffusers   # a local diffusers folder, loaded with safetensors only
          defaults: {width: 832, height: 480, fps: 16, duration_s: 5, steps: 50, guidance: 5.0}
          max_frames: 81      # the window; longer videos render in chunks sharing chunk_overlap latents (2)
          chunk_condition: noised   # or clean, for a model trained to continue a clean prefix
          image_condition: pipeline # takes a manifest's `image`: first_frame or pipeline (absent: it does not)
          mixed_image_batches: true # image and text-only videos of one shape may share a batch
          base: /models/Wan2.1-I2V-14B-480P-Diffusers  # components the folder lacks are loaded from here
    """
    registry = Registry()
    if models_file is None:
        return registry
    try:
        data = yaml.safe_load(Path(models_file).read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ModelNotFound(f"{models_file}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ModelNotFound(f"{models_file}: expected a mapping of model names")
    for name, entry in data.items():
        if not isinstance(entry, dict) or "path" not in entry:
            raise ModelNotFound(f"{models_file}: model {name!r} needs a 'path' to a local diffusers folder")
        path = Path(entry["path"]).expanduser()
        base = Path(entry["base"]).expanduser() if entry.get("base") is not None else None
        if not ((base or path) / "model_index.json").is_file():
            raise ModelNotFound(f"{models_file}: model {name!r}: {base or path} holds no model_index.json")
        given = entry.get("defaults") or {}
        unknown = set(given) - set(_DEFAULT_FIELDS)
        if unknown:
            raise ModelNotFound(f"{models_file}: model {name!r}: unknown defaults {sorted(unknown)}")
        defaults = ModelDefaults(**{f: t(given.get(f, getattr(WAN_DEFAULTS, f))) for f, t in _DEFAULT_FIELDS.items()})
        registry.models[str(name)] = ModelInfo(
            name=str(name),
            defaults=defaults,
            path=path,
            temporal_factor=int(entry.get("temporal_factor", 4)),
            spatial_multiple=int(entry.get("spatial_multiple", 16)),
            max_frames=int(entry.get("max_frames", 81)),
            chunk_overlap=int(entry.get("chunk_overlap", 2)),
            chunk_condition=_chunk_condition(models_file, name, entry.get("chunk_condition", "noised")),
            max_sequence_length=int(entry.get("max_sequence_length", 512)),
            image_condition=_image_condition(models_file, name, entry.get("image_condition")),
            mixed_image_batches=_flag(models_file, name, "mixed_image_batches", entry.get("mixed_image_batches", True)),
            base=base,
        )
    return registry


CHUNK_CONDITIONS = ("noised", "clean")


def _chunk_condition(models_file: Path, name: str, value: object) -> str:
    if value not in CHUNK_CONDITIONS:
        raise ModelNotFound(f"{models_file}: model {name!r}: chunk_condition must be one of "
                            f"{', '.join(CHUNK_CONDITIONS)}, got {value!r}")
    return str(value)


IMAGE_CONDITIONS = ("first_frame", "pipeline")


def _image_condition(models_file: Path, name: str, value: object) -> str | None:
    if value is not None and value not in IMAGE_CONDITIONS:
        raise ModelNotFound(f"{models_file}: model {name!r}: image_condition must be one of "
                            f"{', '.join(IMAGE_CONDITIONS)} (or left out: no images), got {value!r}")
    return value


def _flag(models_file: Path, name: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ModelNotFound(f"{models_file}: model {name!r}: {key} must be true or false, got {value!r}")
    return value
