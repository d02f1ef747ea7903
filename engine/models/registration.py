"""What a registration may add to its base diffusers folder, and the checks made when the models file is read.

- `adapters`: LoRA files in any layout diffusers' Wan LoRA loading reads (engine.adapters.files: diffusers'
  `transformer.<module>.lora_A.weight`, the original Wan / ComfyUI `diffusion_model.*` names, musubi's
  `lora_unet_*`), each with a scale and the expert it goes to; converted by diffusers and fused into that
  transformer at load. A two-expert folder (Wan 2.2 A14B) takes one per expert, as few-step Wan 2.2
  adapters are published in high-noise and low-noise pairs, both files naming their tensors `transformer.*`.
- `sampler`: a diffusers scheduler by name, with its shift, replacing the folder's.
- `decoder`: a light VAE decoder folder (engine.adapters.light_decoder) used instead of the VAE's decoder.
- `teacher`: the registration a distilled one is judged against (engine.levers.gate_rules.judge_distilled).
- `clip`: a CLIP folder (engine.frames.clip_score) whose score reads prompt adherence in that gate beyond the toy world.

Every check reads file headers and configs only (a safetensors header is its first 8 + n bytes), never weights, and
imports neither torch nor diffusers: the registry is read at submit as well as at worker start. A failed check is a
ModelNotFound naming the models file, the model and the key, which the CLI turns into exit 2.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelNotFound

# An adapter's `expert` -> the pipeline component it is fused into: Wan 2.2 A14B's high-noise expert is
# `transformer` (and a one-transformer folder's only transformer is it), its low-noise expert `transformer_2`.
EXPERTS = {"high_noise": "transformer", "low_noise": "transformer_2"}
# The first names of the adapter layouts diffusers converts to its own (original Wan / ComfyUI; musubi-tuner).
CONVERTED_PREFIXES = ("diffusion_model.", "lora_unet_")
HIGH_NOISE = "high_noise"


@dataclass(frozen=True)
class Adapter:
    path: Path
    scale: float = 1.0
    expert: str = HIGH_NOISE

    @property
    def component(self) -> str:
        return EXPERTS[self.expert]


@dataclass(frozen=True)
class Sampler:
    name: str
    shift: float
    # Only for flow_euler: diffusers' shift_terminal, the last sigma before 0 (the schedule stretched to end there).
    shift_terminal: float | None = None

    def key(self) -> str:
        terminal = "" if self.shift_terminal is None else f",terminal={self.shift_terminal:g}"
        return f"{self.name}(shift={self.shift:g}{terminal})"


# Sampler name -> (diffusers scheduler class, the config key its shift goes to, fixed config). Flow-matching
# samplers only: Wan models predict a flow velocity.
SAMPLERS: dict[str, tuple[str, str, dict]] = {
    "flow_euler": ("FlowMatchEulerDiscreteScheduler", "shift", {}),
    # Wan 2.1's published default scheduler.
    "flow_unipc": ("UniPCMultistepScheduler", "flow_shift",
                   {"prediction_type": "flow_prediction", "use_flow_sigmas": True}),
    "flow_dpm": ("DPMSolverMultistepScheduler", "flow_shift",
                 {"prediction_type": "flow_prediction", "use_flow_sigmas": True}),
}


class Problem(Exception):
    """One key's problem; load_registry adds the models file and the model's name."""


def parse_adapters(value: object, base: Path, two_experts: bool = False) -> tuple[Adapter, ...]:
    """`two_experts`: the folder is a two-expert one (its model_index.json has a boundary_ratio and a
    transformer_2), so an adapter may go to its low-noise expert."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Problem(f"adapters must be a list of {{path, scale, expert}}, got {value!r}")
    adapters = []
    for i, entry in enumerate(value):
        key = f"adapters[{i}]"
        if not isinstance(entry, dict) or "path" not in entry or set(entry) - {"path", "scale", "expert"}:
            raise Problem(f"{key} must be {{path: FILE, scale: NUMBER, expert: high_noise|low_noise}}, got {entry!r}")
        path = Path(str(entry["path"])).expanduser()
        scale = _number(entry.get("scale", 1.0), f"{key}.scale")
        expert = entry.get("expert", HIGH_NOISE)
        if expert not in EXPERTS:
            raise Problem(f"{key}.expert must be one of {', '.join(EXPERTS)}, got {expert!r}")
        if expert != HIGH_NOISE and not two_experts:
            raise Problem(f"{key}.expert: {expert} is for two-expert folders (Wan 2.2 A14B); "
                          f"{base / 'model_index.json'} has no boundary_ratio and transformer_2")
        if not path.is_file():
            raise Problem(f"{key}.path: {path} is not a file")
        if path.suffix != ".safetensors":
            raise Problem(f"{key}.path: {path} is not a .safetensors file")
        check_lora(path, base, key, EXPERTS[expert])
        adapters.append(Adapter(path, scale, expert))
    return tuple(adapters)


def parse_sampler(value: object) -> Sampler | None:
    if value is None:
        return None
    if not isinstance(value, dict) or "name" not in value:
        raise Problem(f"sampler must be {{name: NAME, shift: NUMBER}}, got {value!r}")
    name = value["name"]
    if name not in SAMPLERS:
        raise Problem(f"sampler.name: unknown sampler {name!r} (known: {', '.join(SAMPLERS)})")
    allowed = {"name", "shift"} | ({"shift_terminal"} if name == "flow_euler" else set())
    if set(value) - allowed:
        raise Problem(f"sampler: unknown keys {sorted(set(value) - allowed)} for {name} (allowed: {sorted(allowed)})")
    shift = _number(value.get("shift", 1.0), "sampler.shift")
    if shift <= 0:
        raise Problem(f"sampler.shift must be above 0, got {shift:g}")
    terminal = value.get("shift_terminal")
    if terminal is not None:
        terminal = _number(terminal, "sampler.shift_terminal")
        if not 0 < terminal < 1:
            raise Problem(f"sampler.shift_terminal must be between 0 and 1, got {terminal:g}")
    return Sampler(str(name), shift, terminal)


def parse_clip(value: object) -> Path | None:
    """A CLIP folder (engine.frames.clip_score) as transformers saves one: config.json of model_type "clip", weights,
    and the tokenizer and image processor files CLIPProcessor reads."""
    if value is None:
        return None
    folder = Path(str(value)).expanduser()
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise Problem(f"clip: {folder} holds no config.json (a folder saved by transformers' CLIPModel)")
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except json.JSONDecodeError as exc:
        raise Problem(f"clip: {config_file} is not valid JSON: {exc}") from None
    if model_type != "clip":
        raise Problem(f"clip: {config_file}: model_type is {model_type!r}, expected 'clip'")
    if not any((folder / w).is_file() for w in ("model.safetensors", "pytorch_model.bin")):
        raise Problem(f"clip: {folder} holds no model.safetensors")
    if not any((folder / c).is_file() for c in ("preprocessor_config.json", "processor_config.json")):
        raise Problem(f"clip: {folder} holds no processor config (save the CLIPProcessor beside the model)")
    return folder


def parse_decoder(value: object, base: Path) -> Path | None:
    if value is None:
        return None
    folder = Path(str(value)).expanduser()
    config_file, weights = folder / "config.json", folder / "diffusion_pytorch_model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        raise Problem(f"decoder: {folder} needs config.json and diffusion_pytorch_model.safetensors")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise Problem(f"decoder: {config_file} is not valid JSON: {exc}") from None
    if config.get("_class_name") != "LightDecoder":
        raise Problem(f"decoder: {config_file}: _class_name is {config.get('_class_name')!r}, expected 'LightDecoder'")
    vae = json.loads((base / "vae" / "config.json").read_text(encoding="utf-8"))
    # AutoencoderKLWan's defaults, for configs saved before these keys existed (Wan 2.1's: 8x space, 4x time).
    wanted = {"latent_channels": vae.get("z_dim", 16), "spatial_factor": vae.get("scale_factor_spatial", 8),
              "temporal_factor": vae.get("scale_factor_temporal", 4)}
    for key, value_ in wanted.items():
        if config.get(key) != value_:
            raise Problem(f"decoder: {config_file}: {key} is {config.get(key)!r}, but the model's VAE has {value_}")
    header = read_header(weights)
    conv_in = header.get("conv_in.weight", {}).get("shape")
    if conv_in is None or conv_in[1] != wanted["latent_channels"]:
        raise Problem(f"decoder: {weights}: conv_in.weight is {conv_in}, expected {wanted['latent_channels']} "
                      f"input channels")
    return folder


def check_lora(path: Path, base: Path, key: str, component: str = "transformer") -> None:
    """Every LoRA tensor names a linear layer of the base folder's `component` (the expert it goes to) with
    matching sizes: lora_A (rank, in), lora_B (out, rank) against the base weight (out, in).

    The tensors are named `transformer.*` whichever expert takes them: diffusers' WanLoraLoaderMixin reads only
    those (with `load_into_transformer_2` for the low-noise expert), and drops any other prefix, so a
    `transformer_2.*` tensor would be silently ignored: refused here instead."""
    lora = read_header(path)
    if not lora:
        raise Problem(f"{key}.path: {path} holds no tensors")
    # The layouts diffusers converts (WanLoraLoaderMixin.lora_state_dict: by the first tensor name's prefix; it
    # strips that prefix from every name, so a file mixing layouts would be misread). Their tensors are followed
    # through diffusers' conversion when the model loads (engine.adapters.files): that needs torch, which reading
    # the models file at submit must not import.
    for prefix in CONVERTED_PREFIXES:
        if any(name.startswith(prefix) for name in lora):
            other = sorted(name for name in lora if not name.startswith(prefix))
            if other:
                raise Problem(f"{key}.path: {path}: tensor {other[0]!r} is not named {prefix}* like the file's "
                              "other tensors; diffusers reads one layout per file")
            return
    layers: dict[str, dict] | None = None
    for name, info in sorted(lora.items()):
        part, _, rest = name.partition(".")
        if part == "transformer_2":
            raise Problem(f"{key}.path: {path}: tensor {name!r}: diffusers loads only tensors named transformer.*; "
                          f"name them so and give the adapter expert: low_noise to fuse it into transformer_2")
        if part != "transformer" or ".lora_" not in rest:
            raise Problem(f"{key}.path: {path}: tensor {name!r} is in none of the layouts diffusers reads "
                          f"(transformer.<module>.lora_A.weight / lora_B.weight, diffusion_model.*, lora_unet_*)")
        if layers is None:
            layers = _base_header(base, component, key)
        module, _, kind = rest.rpartition(".lora_")
        weight = layers.get(f"{module}.weight")
        if weight is None:
            raise Problem(f"{key}.path: {path}: tensor {name!r}: the base {component} has no layer {module!r}")
        out_features, in_features = weight["shape"][0], weight["shape"][-1]
        shape = info["shape"]
        if kind == "A.weight" and (len(shape) != 2 or shape[1] != in_features):
            raise Problem(f"{key}.path: {path}: tensor {name!r} is {shape}, but {component}.{module} takes "
                          f"{in_features} inputs")
        if kind == "B.weight" and (len(shape) != 2 or shape[0] != out_features):
            raise Problem(f"{key}.path: {path}: tensor {name!r} is {shape}, but {component}.{module} gives "
                          f"{out_features} outputs")
        # PEFT reads a layer's rank from its lora_B and sizes its lora_A by it: one without the other fails.
        if kind in ("A.weight", "B.weight"):
            pair = f"transformer.{module}.lora_{'B' if kind == 'A.weight' else 'A'}.weight"
            if pair not in lora:
                raise Problem(f"{key}.path: {path}: tensor {name!r} has no {pair!r} to pair with")


def _base_header(base: Path, part: str, key: str) -> dict:
    folder = base / part
    index = sorted(folder.glob("*.safetensors.index.json"))
    if index:
        shards = sorted(set(json.loads(index[0].read_text(encoding="utf-8"))["weight_map"].values()))
        return {k: v for shard in shards for k, v in read_header(folder / shard).items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise Problem(f"{key}: the base folder {base} has no {part} weights to fit the adapter to")
    return {k: v for f in files for k, v in read_header(f).items()}


def read_header(path: Path) -> dict[str, dict]:
    """A safetensors file's tensor table (name -> dtype, shape), from its header alone."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100_000_000:
                raise ValueError(f"header length {length}")
            header = json.loads(f.read(length))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise Problem(f"{path} is not a safetensors file ({exc})") from None
    header.pop("__metadata__", None)
    return header


def _number(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Problem(f"{key} must be a number, got {value!r}")
    return float(value)


def wrap(models_file: Path, name: str, problem: Problem) -> ModelNotFound:
    return ModelNotFound(f"{models_file}: model {name!r}: {problem}")
