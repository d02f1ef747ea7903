"""The operator's models file (REELBATCH_MODELS): each entry read, checked against its folder's own files, and
registered beside the built-in models.

Apart from engine.models.registry (what a registration is, and the built-ins) because reading a file an operator wrote
is its own work: every key checked, every error naming the file, the model and the value.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from engine.errors import ModelNotFound
from engine.frames.video_checks import DEFAULT_THRESHOLDS, Thresholds
from engine.levers.precision import check_mode
from engine.models.families import PUBLISHED, FolderFacts, Published, check_image_condition, read_folder
from engine.models.keys import REGISTRATION_KEYS, read_models_file
from engine.models.registration import Problem, parse_adapters, parse_clip, parse_decoder, parse_sampler, wrap
from engine.models.registry import MODEL_NAME, WAN_DEFAULTS, ModelDefaults, ModelInfo, Registry
from engine.models.shape_rules import check_registration, read_rules

_DEFAULT_FIELDS = {f: type(getattr(WAN_DEFAULTS, f)) for f in ModelDefaults.__dataclass_fields__}


def load_registry(models_file: Path | None = None) -> Registry:
    """The built-in models plus those in `models_file`, a YAML mapping such as::

        wan-1.3b:
          path: /models/Wan2.1-T2V-1.3B-Diffusers   # a local diffusers folder, loaded with safetensors only
          defaults: {width: 832, height: 480, fps: 16, duration_s: 5, steps: 50, guidance: 5.0}
          max_frames: 81      # the window; longer videos render in chunks sharing chunk_overlap latents (2)
          chunk_condition: noised   # or clean, for a model trained to continue a clean prefix
          max_batch: 2        # at most this many videos per batch, whatever the worker's --max-batch
        wan-1.3b-fast:            # the same folder, distilled: its own name, shape key and quality gate
          path: /models/Wan2.1-T2V-1.3B-Diffusers
          adapters: [{path: /models/wan-step-distill-lora.safetensors, scale: 1.0}]   # any layout diffusers reads
          sampler: {name: flow_euler, shift: 5.0}   # flow_euler (shift_terminal too), flow_unipc or flow_dpm
          decoder: /models/wan-light-decoder         # engine.adapters.light_decoder folder; the VAE's encoder stays
          teacher: wan-1.3b       # refused until its distilled gate passed (engine.levers.gates)
          clip: /models/clip-vit-base-patch32        # optional: its gate compares CLIP scores with the teacher's
          defaults: {steps: 4, guidance: 1.0}        # guidance <= 1: one transformer pass a step
        wan22-a14b:
          path: /models/Wan2.2-T2V-A14B-Diffusers   # two experts: guidance is the high-noise one's
          guidance_2: 3.0            # the low-noise expert's scale (the family's published 3.0 when left out)
          offload_idle_expert: true  # one expert in device memory at a time, swapped at the boundary
          adapters:                  # a published pair: each file fused into its own expert
            - {path: /models/wan22-4step-high.safetensors, expert: high_noise}   # `transformer` (the default)
            - {path: /models/wan22-4step-low.safetensors, expert: low_noise}     # `transformer_2`

    The folder's own files say its family (engine.models.families), its frame rule and the sides it allows; what the
    file leaves out comes from the family's published defaults. Each addition (adapters, sampler, decoder,
    teacher) is checked here, from file headers and configs (engine.models.registration).
          image_condition: pipeline # takes a manifest's `image`: first_frame or pipeline (absent: it does not)
          mixed_image_batches: true # image and text-only videos of one shape may share a batch
          base: /models/Wan2.1-I2V-14B-480P-Diffusers  # components the folder lacks are loaded from here
          precision: int8           # engine.levers.precision: auto, fp32, bf16, fp16, int8-weight, int8, fp8 (gated)
          text_encoder_precision: int8-weight  # the text encoder's own, the same modes (gated); left out: as above
          checks: {max_flicker: 45, min_motion: 1.0}  # engine.frames.video_checks.Thresholds over its defaults
    """
    registry = Registry()
    if models_file is None:
        return registry
    data, lines = read_models_file(models_file)
    data = data or {}
    if not isinstance(data, dict):
        raise ModelNotFound(f"{models_file}: expected a mapping of model names")
    for name, entry in data.items():
        line = f"{models_file}:{lines.get(str(name), 1)}"
        if not re.fullmatch(MODEL_NAME, str(name)):
            raise ModelNotFound(f"{line}: model {name!r}: a name has letters, digits, '.', '_' and '-' only, "
                                "and starts with a letter or digit")
        if not isinstance(entry, dict):
            stray = " (a registration's key: indent it under its model)" if name in REGISTRATION_KEYS else ""
            raise ModelNotFound(f"{line}: model {name!r} must be a mapping with a 'path' to a local diffusers "
                                f"folder, got {entry!r}{stray}")
        if "path" not in entry:
            raise ModelNotFound(f"{line}: model {name!r} needs a 'path' to a local diffusers folder")
        where = f"{models_file}: model {name!r}"
        path = Path(entry["path"]).expanduser()
        base = Path(entry["base"]).expanduser() if entry.get("base") is not None else None
        if not ((base or path) / "model_index.json").is_file():
            raise ModelNotFound(f"{where}: {base or path} holds no model_index.json")
        facts = read_folder(base or path, where)
        check_image_condition(facts, entry.get("image_condition"), where, base or path)
        published = PUBLISHED[facts.family]
        given = entry.get("defaults") or {}  # its keys checked by read_models_file
        if not isinstance(given, dict):
            raise ModelNotFound(f"{where}: defaults must be a mapping ({', '.join(_DEFAULT_FIELDS)}), got {given!r}")
        defaults = _defaults(where, given, published)
        registry.sources[str(name)] = line
        registry.models[str(name)] = ModelInfo(
            name=str(name),
            defaults=defaults,
            path=path,
            temporal_factor=_temporal_factor(where, entry, facts),
            spatial_multiple=_spatial_multiple(where, entry, facts),
            max_frames=int(entry.get("max_frames", published.max_frames)),
            chunk_overlap=int(entry.get("chunk_overlap", 2)),
            chunk_condition=_chunk_condition(models_file, name, entry.get("chunk_condition", "noised")),
            max_sequence_length=int(entry.get("max_sequence_length", 512)),
            max_batch=_max_batch(models_file, name, entry.get("max_batch")),
            family=facts.family,
            boundary_ratio=facts.boundary_ratio,
            **_experts(where, entry, facts, published),
            **_additions(models_file, str(name), entry, path, two_experts=facts.boundary_ratio is not None),
            image_condition=_image_condition(models_file, name, entry.get("image_condition")),
            mixed_image_batches=_flag(models_file, name, "mixed_image_batches", entry.get("mixed_image_batches", True)),
            base=base,
            precision=_precision(where, entry.get("precision")),
            text_encoder_precision=_precision(where, entry.get("text_encoder_precision"), "text_encoder_precision"),
            checks=_checks(models_file, name, entry.get("checks")),
            rules=read_rules(path, base, where),
        )
        check_registration(registry.models[str(name)], line, given, facts.family)
    for info in registry.models.values():
        if info.teacher is not None and (info.teacher not in registry or info.teacher == info.name):
            raise ModelNotFound(f"{models_file}: model {info.name!r}: teacher: {info.teacher!r} is not another "
                                f"registered model (registered: {', '.join(registry.names())})")
    return registry


def _defaults(where: str, given: dict, published: Published) -> ModelDefaults:
    """The family's published defaults with the registration's over them, each a number of its field's kind."""
    values = {}
    for f, kind in _DEFAULT_FIELDS.items():
        value = given.get(f, getattr(published, f))
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or (kind is int and value != int(value))):
            what = "a whole number" if kind is int else "a number"
            raise ModelNotFound(f"{where}: defaults.{f} must be {what}, got {value!r}")
        values[f] = kind(value)
    return ModelDefaults(**values)


def _max_batch(models_file: Path, name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelNotFound(f"{models_file}: model {name!r}: max_batch must be a whole number of at least 1, "
                            f"got {value!r}")
    return value


def _additions(models_file: Path, name: str, entry: dict, path: Path, two_experts: bool) -> dict:
    """The adapters, sampler, decoder and teacher of an entry, checked (engine.models.registration); `two_experts`: the
    folder has a low-noise expert an adapter may go to."""
    try:
        teacher = entry.get("teacher")
        if teacher is not None and not isinstance(teacher, str):
            raise Problem(f"teacher must be a model name, got {teacher!r}")
        return {"adapters": parse_adapters(entry.get("adapters"), path, two_experts),
                "sampler": parse_sampler(entry.get("sampler")),
                "decoder": parse_decoder(entry.get("decoder"), path), "teacher": teacher,
                "clip": parse_clip(entry.get("clip"))}
    except Problem as problem:
        raise wrap(models_file, name, problem) from None


CHUNK_CONDITIONS = ("noised", "clean")
MAX_GUIDANCE = 30.0  # as a manifest's guidance (jobs.manifest.fields)


def _chunk_condition(models_file: Path, name: str, value: object) -> str:
    if value not in CHUNK_CONDITIONS:
        raise ModelNotFound(f"{models_file}: model {name!r}: chunk_condition must be one of "
                            f"{', '.join(CHUNK_CONDITIONS)}, got {value!r}")
    return str(value)


def _temporal_factor(where: str, entry: dict, facts: FolderFacts) -> int:
    """The folder's VAE decides it; a models file may state it, and must state it right."""
    value = entry.get("temporal_factor", facts.temporal_factor)
    if value != facts.temporal_factor:
        raise ModelNotFound(f"{where}: temporal_factor {value!r}, but its VAE compresses time by "
                            f"{facts.temporal_factor} (vae/config.json scale_factor_temporal)")
    return facts.temporal_factor


def _spatial_multiple(where: str, entry: dict, facts: FolderFacts) -> int:
    """At least what the VAE, the patching and WanPipeline allow; a models file may ask for a coarser grid."""
    value = entry.get("spatial_multiple", facts.spatial_multiple)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value % facts.spatial_multiple:
        raise ModelNotFound(f"{where}: spatial_multiple {value!r} must be a multiple of {facts.spatial_multiple} "
                            "(the VAE's scale_factor_spatial x the transformer's patch, and 16 for WanPipeline)")
    return value


def _experts(where: str, entry: dict, facts: FolderFacts, published: Published) -> dict:
    """guidance_2 and offload_idle_expert: for two-expert folders only; boundary_ratio, if stated, as the folder's
    model_index.json has it (the pipeline applies the folder's; edit that file to move the switch)."""
    two = facts.boundary_ratio is not None
    for key in ("guidance_2", "offload_idle_expert", "boundary_ratio"):
        if key in entry and not two:
            raise ModelNotFound(f"{where}: {key} is for two-expert folders; its model_index.json has no "
                                "boundary_ratio")
    if "boundary_ratio" in entry and entry["boundary_ratio"] != facts.boundary_ratio:
        raise ModelNotFound(f"{where}: boundary_ratio {entry['boundary_ratio']!r}, but its model_index.json has "
                            f"{facts.boundary_ratio} (edit that file to move the switch)")
    guidance_2 = entry.get("guidance_2", published.guidance_2)
    if guidance_2 is not None and (isinstance(guidance_2, bool) or not isinstance(guidance_2, (int, float))
                                   or not 0 <= guidance_2 <= MAX_GUIDANCE):
        raise ModelNotFound(f"{where}: guidance_2 must be a number from 0 to {MAX_GUIDANCE:g}, got {guidance_2!r}")
    offload = entry.get("offload_idle_expert", False)
    if not isinstance(offload, bool):
        raise ModelNotFound(f"{where}: offload_idle_expert must be true or false, got {offload!r}")
    return {"guidance_2": None if guidance_2 is None else float(guidance_2), "offload_idle_expert": offload}
def _checks(models_file: Path, name: str, value: object) -> Thresholds:
    """The limits its videos are checked against (engine.frames.video_checks.Thresholds): the defaults, with what the
    mapping names over them; each value a finite number of at least 0."""
    if value is None:
        return DEFAULT_THRESHOLDS
    where = f"{models_file}: model {name!r}: checks"
    known = list(Thresholds.__dataclass_fields__)
    if not isinstance(value, dict):
        raise ModelNotFound(f"{where} must be a mapping of limits ({', '.join(known)}), got {value!r}")
    for key, limit in value.items():  # each key known (engine.models.keys)
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 <= limit < float("inf"):
            raise ModelNotFound(f"{where}.{key} must be a finite number of at least 0, got {limit!r}")
    return Thresholds(**{**vars(DEFAULT_THRESHOLDS), **{k: float(v) for k, v in value.items()}})


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


def _precision(where: str, value: object, key: str = "precision") -> str | None:
    """A mode of engine.levers.precision.MODES, or None (left out: `precision` is REELBATCH_PRECISION's,
    `text_encoder_precision` the pipeline's)."""
    if value is None:
        return None
    try:
        return check_mode(value)
    except ValueError as exc:
        raise ModelNotFound(f"{where}: {key}{str(exc).removeprefix('precision')}") from None
