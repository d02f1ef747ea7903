"""An adapter file in any layout diffusers' Wan LoRA loading reads, converted by diffusers itself, and applied in
full or refused.

Wan LoRAs are published in three layouts, and `WanLoraLoaderMixin.lora_state_dict` reads all three:
- diffusers' own (`transformer.blocks.0.attn1.to_q.lora_A.weight` / `.lora_B.weight`), as PEFT saves them;
- the original Wan / ComfyUI names (`diffusion_model.blocks.0.self_attn.q.lora_down.weight`, `.lora_up.weight`,
  `.alpha`, `cross_attn.k_img`, `ffn.0`, `.diff_b` biases, `head.head.diff`), converted by
  `_convert_non_diffusers_wan_lora_to_diffusers`;
- musubi-tuner's Kohya-style names (`lora_unet_blocks_0_self_attn_q.lora_down.weight` with `.alpha`), converted
  by `_convert_musubi_wan_lora_to_diffusers`.
This module writes no key map of its own: it runs diffusers' conversion and checks what came out of it. The
converters fold `alpha / rank` into the A and B matrices, drop some tensors on purpose (norm-layer `.diff` keys,
other `.diff` keys they do not handle, `dora_scale`) and raise KeyError or ValueError on files they do not expect.
Users of other tools meet both as a crash or as an adapter applied in part with no word. Here every tensor of the
file is followed through the conversion (`_Traced` records which file tensors each converted tensor was made
from), and then through PEFT's injection (every converted pair must sit in its layer with the same numbers): a file
tensor that reaches no layer is refused by name, unless it is all zeros (applying zeros changes nothing; the
norm `.diff` keys of published step-distilled LoRAs are such), and a file diffusers cannot convert is refused
with diffusers' own words.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten, tree_map

from engine.errors import ModelNotFound


class AdapterRefused(ModelNotFound):
    """An adapter file that would not be applied in full: permanent, like a model that is not registered."""


class _Traced(torch.Tensor):
    """A file tensor that remembers which file tensors it came from, through every torch operation the converter
    applies (a product with an alpha's scale, a transpose); `.item()` on one (an alpha read) counts as used."""

    _sources: frozenset[str]
    read: set[str]  # shared by every _Traced of one conversion: the sources whose value was read as a number

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        traced = [x for x in leaves if isinstance(x, _Traced)]
        sources = frozenset().union(*(x._sources for x in traced))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func is torch.Tensor.item and traced:
            traced[0].read.update(sources)
        if not traced:
            return out
        return tree_map(lambda x: _trace(x, sources, traced[0].read) if isinstance(x, torch.Tensor) else x, out)


def _trace(tensor: torch.Tensor, sources: frozenset[str], read: set[str]) -> _Traced:
    with torch._C.DisableTorchFunctionSubclass():
        out = tensor.as_subclass(_Traced)
    out._sources, out.read = sources, read
    return out


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return tensor.as_subclass(torch.Tensor)


def convert(path: Path) -> dict[str, torch.Tensor]:
    """The file's tensors in diffusers' layout (`transformer.<module>.lora_A.weight`, `.lora_B.weight`,
    `.lora_B.bias`), as `load_lora_weights` would load them; AdapterRefused naming the file and its tensors if
    diffusers cannot convert it or would drop any tensor that is not all zeros."""
    from diffusers import WanPipeline
    from safetensors.torch import load_file

    original = load_file(str(path))
    read: set[str] = set()
    traced = {name: _trace(tensor, frozenset([name]), read) for name, tensor in original.items()}
    try:
        converted = WanPipeline.lora_state_dict(dict(traced))
    except (KeyError, ValueError, IndexError, RuntimeError) as exc:
        raise AdapterRefused(f"{path}: diffusers' Wan LoRA conversion cannot read it ({type(exc).__name__}: "
                             f"{exc or 'no message'})") from None
    used = set(read)
    for tensor in converted.values():
        if isinstance(tensor, _Traced):
            used |= tensor._sources
    outside = sorted(k for k in converted if not k.startswith("transformer."))
    if outside:
        raise AdapterRefused(f"{path}: tensors {_names(outside)} are named for no transformer: diffusers loads only "
                             "transformer.* from a diffusers-layout file and would drop them")
    dropped = sorted(name for name in set(original) - used if original[name].count_nonzero() > 0)
    if dropped:
        raise AdapterRefused(f"{path}: diffusers' Wan LoRA conversion would drop {len(dropped)} tensor(s) holding "
                             f"non-zero values: {_names(dropped)}")
    return {name: _plain(tensor) for name, tensor in converted.items()}


def check_injected(path: Path, converted: dict[str, torch.Tensor], transformer: torch.nn.Module,
                   adapter_name: str, component: str) -> None:
    """After `load_lora_weights`: every converted pair sits in its layer of `transformer` under `adapter_name`, with
    the file's numbers; a layer PEFT added beyond them must hold zeros (diffusers pads a text-to-video LoRA with zero
    `add_k_proj`/`add_v_proj` pairs on an image-to-video transformer)."""
    modules = dict(transformer.named_modules())
    missing, differ = [], []
    wanted = {name.removeprefix("transformer.").rpartition(".lora_")[0] for name in converted}
    for module_name in sorted(wanted):
        module = modules.get(module_name)
        if module is None or adapter_name not in getattr(module, "lora_A", {}):
            missing.append(module_name)
            continue
        for part in ("lora_A", "lora_B"):
            layer = getattr(module, part)[adapter_name]
            for kind in ("weight", "bias"):
                tensor = converted.get(f"transformer.{module_name}.{part}.{kind}")
                if tensor is None:
                    continue
                have = getattr(layer, kind)
                if have is None or not torch.equal(have.detach().cpu(), tensor.to(have.dtype)):
                    differ.append(f"transformer.{module_name}.{part}.{kind}")
    extra = [name for name, module in modules.items() if name not in wanted and adapter_name in getattr(
        module, "lora_B", {}) and module.lora_B[adapter_name].weight.count_nonzero() > 0]
    if missing or differ or extra:
        raise AdapterRefused(f"{path}: applied in part to {component}: layers not adapted {_names(missing)}, tensors "
                             f"loaded with other values {_names(differ)}, layers adapted beyond the file "
                             f"{_names(extra)}")


def _names(names: list[str], shown: int = 8) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(repr(n) for n in names[:shown]) + more
