"""Registered models: what a manifest may name, where the weights live, and the model's native defaults.

A manifest names a model; only the operator maps names to folders (the built-in `tiny`, plus a models file named by
`REELBATCH_MODELS`, read by engine.models.file), so a manifest can never point a worker at an arbitrary path.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelNotFound
from engine.frames.video_checks import DEFAULT_THRESHOLDS, Thresholds
from engine.long.chunks import ChunkPlan, plan
from engine.models.families import PUBLISHED
from engine.models.registration import Adapter, Sampler
from engine.models.shape_rules import TINY_RULES, ShapeRules, read_rules

# The longest video: this many windows (Wan: 64 x ~4.75 s, about 5 minutes at 16 fps).
MAX_CHUNKS = 64

# A model's name: it becomes part of a ticket queue's name (`QUEUE.model.NAME`) and of comma-separated lists.
MODEL_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"


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
    # chunks of this length sharing `chunk_overlap` latent frames (engine.long.chunks), at most MAX_CHUNKS of them.
    max_frames: int = 81
    chunk_overlap: int = 2
    # How a chunk's overlap is tied to the chunk before at each step: "noised" (the clean latents noised to the
    # step's level, inpainting-style; works with any model) or "clean" (held clean with timestep 0 on its tokens, as
    # diffusion forcing and LTX condition; for models trained to continue a clean prefix, like `toy`).
    chunk_condition: str = "noised"
    # WanPipeline.__call__ defaults to 512 text tokens but encode_prompt to 226: always pass it, and key caches on it.
    max_sequence_length: int = 512
    builtin: bool = False
    # A few-step variant of the folder (engine.models.registration): LoRA adapters fused at load (each into its expert),
    # a sampler replacing the folder's scheduler, a light decoder replacing the VAE's, and the registration it was
    # distilled from, which its quality gate is measured against (engine.levers.gate_rules.judge_distilled).
    adapters: tuple[Adapter, ...] = ()
    sampler: Sampler | None = None
    decoder: Path | None = None
    teacher: str | None = None
    # A CLIP folder (engine.frames.clip_score): a distilled registration's gate compares its CLIP score with its
    # teacher's.
    clip: Path | None = None
    # The largest batch a worker renders of this model, where smaller than the worker's own (`--max-batch`): a large
    # model's batch that fits a GPU's memory. None: the worker's.
    max_batch: int | None = None
    # engine.models.families: wan2.1, wan2.2-a14b (two experts) or wan2.2-ti2v, read from the folder's model_index.json.
    family: str = "wan2.1"
    # Two-expert folders: the switch (from model_index.json, as the pipeline applies it) and the low-noise expert's
    # guidance scale. A manifest's `guidance` is the high-noise expert's; the second scale belongs to the model, as
    # the published pair does (4.0 and 3.0 for T2V-A14B). None: the same as `guidance` (WanPipeline's default).
    boundary_ratio: float | None = None
    guidance_2: float | None = None
    # Two-expert folders: keep the idle expert in CPU memory and swap at the boundary (engine.loop.experts), so device
    # memory holds one expert, not two.
    offload_idle_expert: bool = False
    # How it takes a picture a video starts from (a manifest's `image`): None, it does not (the field is refused);
    # "first_frame", the picture VAE-encoded is the first latent frame, held clean with timestep 0 on its tokens, as
    # Wan 2.2 TI2V conditions (engine.loop.first_frame); "pipeline", the pipeline's own image-to-video path, Wan 2.1
    # I2V's image encoder and mask channels (engine.loop.i2v), where every video needs a picture and fits one window.
    image_condition: str | None = None
    # Whether a video that starts from a picture may share a batch with text-only videos of its shape. A first_frame
    # model renders both in one loop (a text-only video's tokens get the step's timestep either way, and renders as
    # it does alone to within rounding, tested); false keeps them in batches of their own (Shape.image).
    mixed_image_batches: bool = True
    # A diffusers folder whose components fill in those `path` lacks: a fine-tune shipped as only the parts it
    # changed (`toy-i2v` is a transformer over `toy`'s folder).
    base: Path | None = None
    # The precision it renders at (engine.levers.precision.MODES); None: the engine's default (REELBATCH_PRECISION). A
    # mode below native is lossy: refused until its quality gate for this model passed.
    precision: str | None = None
    # Its text encoder's own precision (engine.levers.precision.text_encoder_mode), gated the same way; None: as the
    # pipeline (`precision`'s float type, the native one under an 8-bit mode).
    text_encoder_precision: str | None = None
    # The limits every rendered video of this model is checked against (engine.frames.video_checks): the documented
    # defaults, or the models file's `checks:` mapping over them.
    checks: Thresholds = DEFAULT_THRESHOLDS
    # What its folder's configs allow (engine.models.shape_rules): checked at submit against every video's size, and
    # against its defaults and window when the models file is read. None: not read (spatial_multiple alone).
    rules: ShapeRules | None = None

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
    # Random weights draw noise by design: not held to the structure check (engine.frames.video_checks).
    checks=Thresholds(min_structure=0.0),
    rules=TINY_RULES,
)

# `tiny`'s image-to-video sibling: diffusers' Wan 2.1 I2V architecture (engine.models.tiny.build_tiny_i2v_pipeline),
# random weights, for testing the pipeline path.
TINY_I2V = dataclasses.replace(TINY, name="tiny-i2v", image_condition="pipeline")

# The `toy` model, trained here on the toy world (toyworld.train); registered once its weights are in this folder.
TOY_WEIGHTS = Path(__file__).resolve().parent / "toy"
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

# `toy-fast`, distilled from `toy` by `reelbatch toy distill` (toyworld.distill; its card in the folder): the toy
# folder with a LoRA, a 4-step Euler sampler and a light decoder. Guidance 1: one transformer pass a step.
TOY_FAST_WEIGHTS = TOY_WEIGHTS.parent / "toy-fast"
TOY_FAST = dataclasses.replace(
    TOY, name="toy-fast", defaults=dataclasses.replace(TOY.defaults, steps=4, guidance=1.0),
    adapters=(Adapter(TOY_FAST_WEIGHTS / "adapter.safetensors"),),
    sampler=Sampler("flow_euler", 3.0, 0.1), decoder=TOY_FAST_WEIGHTS / "decoder", teacher="toy",
)
# `toy`'s transformer fine-tuned to start from a picture of the toy world (toyworld.train_first_frame); the rest of
# the pipeline is `toy`'s, loaded from its folder. Registered once its transformer is in this folder.
TOY_I2V_WEIGHTS = Path(__file__).resolve().parent / "toy-i2v"
TOY_I2V = dataclasses.replace(TOY, name="toy-i2v", path=TOY_I2V_WEIGHTS, base=TOY_WEIGHTS,
                              image_condition="first_frame")

# Wan2.1-T2V-1.3B's published defaults (832x480, 81 frames at 16 fps, 50 steps, guidance 5.0).
WAN_DEFAULTS = ModelDefaults(**{f: getattr(PUBLISHED["wan2.1"], f) for f in ModelDefaults.__dataclass_fields__})


def builtin_models() -> dict[str, ModelInfo]:
    """`tiny` and `tiny-i2v` always; `toy` once its trained weights are in place (`reelbatch toy train --out
    engine/models/toy`), `toy-fast` beside it once distilled (`reelbatch toy distill --out engine/models/toy-fast`),
    and `toy-i2v` once its transformer is in place (`reelbatch toy first-frame`)."""
    models = {"tiny": TINY, "tiny-i2v": TINY_I2V}
    if (TOY_WEIGHTS / "model_index.json").is_file():
        # The shape rules from the folder's own configs, as a models file's registration reads them.
        rules = read_rules(TOY_WEIGHTS, where="built-in model 'toy'")
        models["toy"] = dataclasses.replace(TOY, rules=rules)
        if TOY_FAST.adapters[0].path.is_file() and TOY_FAST.decoder is not None and TOY_FAST.decoder.is_dir():
            models["toy-fast"] = dataclasses.replace(TOY_FAST, rules=rules)
        if (TOY_I2V_WEIGHTS / "transformer" / "config.json").is_file():
            models["toy-i2v"] = dataclasses.replace(
                TOY_I2V, rules=read_rules(TOY_I2V_WEIGHTS, TOY_WEIGHTS, where="built-in model 'toy-i2v'"))
    return models


@dataclass
class Registry:
    """Name -> ModelInfo. Built-ins plus the operator's models file (engine.models.file.load_registry)."""

    models: dict[str, ModelInfo] = field(default_factory=lambda: builtin_models())
    # Where the models file writes each of its registrations ("FILE:LINE"); a built-in one has none.
    sources: dict[str, str] = field(default_factory=dict)

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
