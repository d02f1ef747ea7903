"""What a registration changes on a loaded pipeline (engine.registration): LoRA adapters fused into the transformer,
a sampler in place of the folder's scheduler, a light decoder in place of the VAE's; and the identity its quality
gates are recorded under.

Adapters are loaded and fused once, at load, with diffusers' own LoRA API (PEFT underneath): each file converted
from its published layout by diffusers and checked to lose no tensor (engine.adapter_files), `load_lora_weights`
per adapter (`load_into_transformer_2` for one going to Wan 2.2 A14B's low-noise expert), then for each expert its
adapters' scales (`set_adapters`) and `fuse_lora` of that component alone, and `unload_lora_weights`. Each expert is
then a plain transformer with changed weights, so a step costs what an unadapted step costs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from engine import adapter_files, light_decoder
from engine.models import ModelInfo
from engine.registration import HIGH_NOISE, SAMPLERS, Sampler
from engine.text_cache import ALL_PARTS, model_identity


def fuse_adapters(pipe, info: ModelInfo) -> None:
    """Load every adapter of `info` into its expert, fuse each expert's at their scales, and drop the LoRA layers."""
    if not info.adapters:
        return
    # component -> [(adapter name, scale)], in the registration's order.
    per_expert: dict[str, list[tuple[str, float]]] = {}
    for i, adapter in enumerate(info.adapters):
        name = f"adapter{i}"
        # diffusers' own conversion of whichever layout the file is in, checked to drop nothing, then loaded, and
        # checked to be in its layers in full (engine.adapter_files).
        try:
            converted = adapter_files.convert(adapter.path)
            try:
                pipe.load_lora_weights(converted, adapter_name=name,
                                       load_into_transformer_2=adapter.component == "transformer_2")
            except (KeyError, ValueError, IndexError, RuntimeError) as exc:
                raise adapter_files.AdapterRefused(f"{adapter.path}: diffusers cannot load it into "
                                                   f"{adapter.component}: {exc}") from None
            adapter_files.check_injected(adapter.path, converted, getattr(pipe, adapter.component), name,
                                         adapter.component)
        except adapter_files.AdapterRefused as exc:
            raise adapter_files.AdapterRefused(f"model {info.name!r}: adapters[{i}]: {exc}") from None
        per_expert.setdefault(adapter.component, []).append((name, adapter.scale))
    for component, named in per_expert.items():
        names = [name for name, _ in named]
        # The component's own set_adapters: the pipeline's would ask every expert for every adapter's name.
        getattr(pipe, component).set_adapters(names, [scale for _, scale in named])
        pipe.fuse_lora(components=[component], adapter_names=names, lora_scale=1.0)
    pipe.unload_lora_weights()


def scheduler(sampler: Sampler, base_config):
    """The diffusers scheduler a sampler names, built on the folder's scheduler config (its training timesteps)."""
    import diffusers

    class_name, shift_key, fixed = SAMPLERS[sampler.name]
    extra = {} if sampler.shift_terminal is None else {"shift_terminal": sampler.shift_terminal}
    return getattr(diffusers, class_name).from_config(base_config, **{shift_key: sampler.shift}, **fixed, **extra)


def apply(pipe, info: ModelInfo, device: torch.device):
    """Adapters and sampler applied to `pipe`; returns the light decoder (on `device`, fp32 like the VAE) or None."""
    fuse_adapters(pipe, info)
    if info.sampler is not None:
        pipe.scheduler = scheduler(info.sampler, pipe.scheduler.config)
    return None if info.decoder is None else light_decoder.load(info.decoder, device, torch.float32)


def identity(info: ModelInfo, folder: Path) -> str:
    """What a registration's quality gates are recorded under: the folder's identity (engine.text_cache, every part),
    and, when it has them, its adapters (file names, sizes, mtimes, scales and experts), sampler and decoder. A
    registration without them has the folder's identity unchanged, so gates recorded before these fields existed
    still hold; likewise an adapter on the high-noise expert (the default, and the only one before experts could be
    named) adds what it added then, and one on the low-noise expert adds its expert too."""
    base = model_identity(folder, ALL_PARTS)
    if not info.adapters and info.sampler is None and info.decoder is None:
        return base
    digest = hashlib.sha256(base.encode())
    for adapter in info.adapters:
        stat = adapter.path.stat()
        digest.update(f"adapter\0{adapter.path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0{adapter.scale!r}\0".encode())
        if adapter.expert != HIGH_NOISE:
            digest.update(f"expert\0{adapter.expert}\0".encode())
    if info.sampler is not None:
        digest.update(f"sampler\0{info.sampler.key()}\0".encode())
    if info.decoder is not None:
        digest.update(f"decoder\0{model_identity(info.decoder.parent, (info.decoder.name,))}\0".encode())
    return digest.hexdigest()
