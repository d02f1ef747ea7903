"""What a registration changes on a loaded pipeline (engine.models.registration): LoRA adapters fused into the
transformer, a sampler in place of the folder's scheduler, a light decoder in place of the VAE's. (The identity its
quality gates
are recorded under is engine.levers.content_key's, read through Engine.gate_identity.)

Adapters are loaded and fused once, at load, with diffusers' own LoRA API (PEFT underneath): each file converted
from its published layout by diffusers and checked to lose no tensor (engine.adapters.files), `load_lora_weights`
per adapter (`load_into_transformer_2` for one going to Wan 2.2 A14B's low-noise expert), then for each expert its
adapters' scales (`set_adapters`) and `fuse_lora` of that component alone, and `unload_lora_weights`. Each expert is
then a plain transformer with changed weights, so a step costs what an unadapted step costs.
"""

from __future__ import annotations

import torch

from engine.adapters import files as adapter_files
from engine.adapters import light_decoder
from engine.models.registration import SAMPLERS, Sampler
from engine.models.registry import ModelInfo


def fuse_adapters(pipe, info: ModelInfo) -> None:
    """Load every adapter of `info` into its expert, fuse each expert's at their scales, and drop the LoRA layers."""
    if not info.adapters:
        return
    # component -> [(adapter name, scale)], in the registration's order.
    per_expert: dict[str, list[tuple[str, float]]] = {}
    for i, adapter in enumerate(info.adapters):
        name = f"adapter{i}"
        # diffusers' own conversion of whichever layout the file is in, checked to drop nothing, then loaded, and
        # checked to be in its layers in full (engine.adapters.files).
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
