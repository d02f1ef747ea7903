"""The engine's one config object. Performance switches are plain fields, so each can be turned off and compared."""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    # Wan's VAE norms as a plain sum of squares instead of F.normalize (engine.fast_ops): the same values to one
    # float32 ulp, and on a CPU about half the decode time of a small model.
    fast_vae_norm: bool = True
    # torch.compile of the transformer's repeated blocks (diffusers' compile_repeated_blocks), one compile per input
    # shape per process, cached under cache_dir/inductor (TORCHINDUCTOR_CACHE_DIR) so a restarted worker reuses
    # it. Off by default: on a CPU each new shape costs 15-25 s of compiling, and it is not yet measured on a GPU.
    compile: bool = False

    def exact(self) -> EngineConfig:
        """This config with every switch that changes output bits off: what a plain diffusers call computes."""
        return replace(self, batched_guidance=False, fast_vae_norm=False, compile=False)

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]
