"""A registered model's pipeline from its folder: the pipeline class its registration names, and, for a model with a
`base`, the components its own folder holds loaded over the base's (a fine-tune shipped as the parts it changed)."""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path

import torch

from engine.errors import ModelNotFound
from engine.models.registry import ModelInfo

# With torchao installed (engine.levers.precision's 8-bit modes), diffusers imports it as a pipeline loads, and three
# libraries warn on every load about things reelbatch never uses: torchao that its CUDA-only kernel libraries cannot
# load on a CPU build, torch's pytree that torchao registers enums the old way, and diffusers that it cannot import
# torchao tensor classes for checkpoints serialized by torchao (reelbatch loads float safetensors and quantizes after).
for _name in ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer"):
    if _name != "torchao" or torch.version.cuda is None:
        logging.getLogger(_name).setLevel(logging.ERROR)


def pipeline_class(info: ModelInfo):
    """WanImageToVideoPipeline for the pipeline image path (its image encoder and mask channels), else WanPipeline.
    Each imported only when used: importing the image pipeline pulls in CLIP's image processor, which warns when
    torchvision is missing."""
    if info.image_condition == "pipeline":
        from diffusers import WanImageToVideoPipeline

        return WanImageToVideoPipeline
    from diffusers import WanPipeline

    return WanPipeline


def load_pipeline(info: ModelInfo, path: Path, dtype: torch.dtype, text_encoder_dtype: torch.dtype | None = None):
    """The pipeline in `path` (or `info.base` with `path`'s components over it), safetensors only. Wan's VAE is
    numerically sensitive: it stays in fp32 whatever the transformer runs in. `text_encoder_dtype`: the text
    encoder's own (engine.levers.precision.text_encoder_mode), loaded so by transformers, which keeps UMT5's `wo` layers
    in fp32 under fp16 (its _keep_in_fp32_modules)."""
    dtypes = {"default": dtype, "vae": torch.float32}
    if text_encoder_dtype is not None:
        dtypes["text_encoder"] = text_encoder_dtype
    if info.base is None:
        return pipeline_class(info).from_pretrained(path, dtype=dtypes, use_safetensors=True)
    own = {}
    for name, (library, class_name) in components(info.base).items():
        if (path / name).is_dir():
            cls = getattr(importlib.import_module(library), class_name)
            options = {"torch_dtype": dtypes.get(name, dtype)} if issubclass(cls, torch.nn.Module) else {}
            own[name] = cls.from_pretrained(path / name, use_safetensors=True, **options)
    if not own:
        raise ModelNotFound(f"model {info.name!r}: {path} holds none of the components of its base {info.base}")
    return pipeline_class(info).from_pretrained(info.base, dtype=dtypes, use_safetensors=True, **own)


def components(folder: Path) -> dict[str, tuple[str, str]]:
    """A diffusers folder's components, from its model_index.json: name -> (library, class)."""
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    return {name: tuple(value) for name, value in index.items()
            if not name.startswith("_") and isinstance(value, list) and len(value) == 2 and value[0]}
