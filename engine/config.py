"""The engine's one config object. Performance switches are plain fields, so each can be turned off and compared."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class EngineConfig:
    # Where built-in models (and, later, compile caches) live.
    cache_dir: Path
    # "auto" picks CUDA when present, else the CPU.
    device: str = "auto"
    # "auto": fp32 on the CPU (no fast bf16 here), bf16 on a GPU.
    dtype: str = "auto"
    # Text embeddings kept in memory and under cache_dir/text-embeddings/, keyed by model, dtype, length and text.
    # Exact: a cached embedding is the one the text encoder returned.
    text_cache: bool = True
    # Classifier-free guidance's conditional and unconditional passes in one batched transformer call per step
    # (engine.denoise). Off: diffusers' own loop, two calls per step. Not bit-exact: matmuls of another batch size
    # may round differently, so the quality gate measures it against references rendered with it off.
    batched_guidance: bool = True

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]
