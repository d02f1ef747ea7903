"""The engine's one config object. Performance switches are plain fields, so each can be turned off and compared."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


# Each lossy accelerator's accepted values: (low, high, low end excluded).
LOSSY_RANGES = {"step_cache": (0.0, 1.0, False), "guidance_fraction": (0.0, 1.0, True), "step_scale": (0.0, 1.0, True)}


def gated_attention(name: str) -> bool:
    """Whether an attention backend is a lever behind a gate: SageAttention's kernels ("sage", "sage_varlen",
    "_sage_qk_int8_pv_fp8_cuda", ...) quantize Q and K to 8 bits, so they compute other numbers, not the same math
    rounded otherwise as "flash" does."""
    return "sage" in name


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
    # With the text cache on and an accelerator, the text encoder (UMT5-XXL is 11 GB in bf16) waits in CPU memory and
    # visits the device only to encode texts the cache has not seen; a warm cache never moves it. Exact. Off by
    # default: on an H200 each batch of new prompts spent 6-8 s moving it across PCIe (docs/PERFORMANCE.md); turn it
    # on where device memory is short.
    offload_text_encoder: bool = False
    # Classifier-free guidance's conditional and unconditional passes in one batched transformer call per step
    # (engine.loop.denoise). Off: diffusers' own loop, two calls per step. Not bit-exact: matmuls of another batch size
    # may round differently, so the quality gate measures it against references rendered with it off.
    batched_guidance: bool = True
    # Wan's VAE norms as a plain sum of squares instead of F.normalize (engine.levers.fast_ops): the same values to one
    # float32 ulp, and on a CPU about half the decode time of a small model.
    fast_vae_norm: bool = True
    # torch.compile of the transformer's repeated blocks (diffusers' compile_repeated_blocks), one compile per input
    # shape per process, cached under cache_dir/inductor (TORCHINDUCTOR_CACHE_DIR) so a restarted worker reuses
    # it. Off by default: on a CPU each new shape costs 15-25 s of compiling, and it is not yet measured on a GPU.
    compile: bool = False
    # The transformer's attention kernel, by diffusers' attention-backend name: "native" is torch's SDPA (which picks
    # flash or memory-efficient kernels itself on a GPU); "flash", "_flash_3" or "sage" use those packages where
    # installed. Same math, other rounding.
    attention: str = "native"
    # Ranks one video's tokens are split across (Ulysses sequence parallelism, engine.parallel): every rank runs this
    # engine on the same batch in one torch.distributed group (engine.parallel.spawn). 1: one process, as always.
    ulysses: int = 1
    # 2: the guided steps' two passes on two halves of the ranks (CFG parallel, engine.parallel).
    cfg_parallel: int = 1
    # Ranks that split the tokens by Ring attention (engine.parallel): ulysses x ring x cfg_parallel ranks in all.
    # Not bit-exact: a lossy lever, gated (`ring=R`).
    ring: int = 1
    # Long videos (engine.long.chunks): the noise level below which a chunk's frames shared with the chunk before are
    # left to the model, so it can smooth the join (the stitch then crossfades). 0: tied to the end (measured best
    # on the toy model: docs/LONG_VIDEOS.md).
    chunk_release_sigma: float = 0.0
    # Lossy accelerators: off by default, and used only for a model on which a recorded quality gate passed
    # (engine.levers.gates; `reelbatch bench quality` measures and records them).
    # First-block cache threshold (diffusers' FirstBlockCache): a step whose first block's residual changed by less
    # than this (relative mean) reuses the other blocks' residual from the step before. 0: off.
    step_cache: float = 0.0
    # Classifier-free guidance on this fraction of the steps (the first ones); the rest run the conditional pass
    # only. 1: every step.
    guidance_fraction: float = 1.0
    # Render this fraction of each video's requested steps (at least one). 1: all of them.
    step_scale: float = 1.0
    # Pipelines kept loaded at once: loading another first unloads the least recently used (its device memory freed).
    # A Wan 14B pipeline in bf16 is about 40 GB with its text encoder, so two fit an H200 (141 GB) and one a 48 GB
    # card; a worker that serves more models than this reloads on a switch, which its claims avoid (jobs.claims.claims).
    max_models: int = 2
    # Lossy unless native (engine.levers.precision): the precision a model renders at where its registration names none:
    # auto (native: fp32 on the CPU, bf16 on a GPU), fp32, bf16, fp16, int8-weight, int8, fp8. A mode below native
    # runs only behind a passing gate for that model and mode. "native" (set by lossless and exact) puts every model
    # at native precision whatever its registration says.
    precision: str = "auto"
    # The text encoder's own precision (engine.levers.precision.text_encoder_mode) over its registration's
    # `text_encoder_precision:`: None leaves the registration's; set by `bench quality --setting
    # text_encoder_precision=MODE` to measure a mode's gate; "native" (lossless, exact): as the pipeline.
    text_encoder_precision: str | None = None

    def exact(self) -> EngineConfig:
        """This config with every switch that changes output bits off: what a plain diffusers call computes."""
        return replace(self.lossless(), batched_guidance=False, fast_vae_norm=False, compile=False, attention="native")

    def lossless(self) -> EngineConfig:
        """This config with the lossy accelerators off (a gated attention kernel back to "native", every model at
        native precision): the exact mode a gate measures them against."""
        attention = "native" if gated_attention(self.attention) else self.attention
        return replace(self, step_cache=0.0, guidance_fraction=1.0, step_scale=1.0, attention=attention,
                       precision="native", text_encoder_precision="native", ring=1)

    def lossy(self) -> str:
        """The lossy accelerators this config turns on, as a stable key ("" when none): what a gate is recorded
        for."""
        parts = []
        if self.step_cache:
            parts.append(f"step_cache={self.step_cache:g}")
        if self.guidance_fraction != 1.0:
            parts.append(f"guidance_fraction={self.guidance_fraction:g}")
        if self.step_scale != 1.0:
            parts.append(f"step_scale={self.step_scale:g}")
        if gated_attention(self.attention):
            parts.append(f"attention={self.attention}")
        if self.ring > 1:
            parts.append(f"ring={self.ring}")
        return ",".join(parts)

    def with_lossy(self, setting: str) -> EngineConfig:
        """This config with the lossy accelerators named in `setting` ("step_cache=0.2,step_scale=0.75"); others off.
        ValueError names the part that is wrong."""
        values: dict[str, float | str] = {}
        for part in filter(None, (p.strip() for p in setting.split(","))):
            name, sep, raw = part.partition("=")
            name = name.strip()
            if sep and name == "attention":
                if not gated_attention(raw.strip()):
                    raise ValueError(f"{part!r}: attention={raw.strip()} is not a gated kernel (one with 'sage' in "
                                     "its name); others need no gate")
                values[name] = raw.strip()
                continue
            if sep and name == "ring":
                if not re.fullmatch(r"[0-9]+", raw.strip()) or int(raw) < 2:
                    raise ValueError(f"{part!r}: ring must be a whole number of ranks, at least 2")
                values[name] = int(raw)
                continue
            if sep and name == "text_encoder_precision":
                from engine.levers.precision import check_mode  # torch-free; here to keep this module's imports plain

                try:
                    values[name] = check_mode(raw.strip())
                except ValueError as exc:
                    raise ValueError(f"{part!r}: text_encoder_{exc}") from None
                continue
            if not sep or name not in LOSSY_RANGES:
                raise ValueError(f"{part!r}: expected NAME=VALUE with NAME one of {', '.join(LOSSY_RANGES)}, "
                                 "attention, ring or text_encoder_precision")
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{part!r}: {raw.strip()!r} is not a number") from None
            low, high, low_open = LOSSY_RANGES[name]
            if not (low < value if low_open else low <= value) or value > high:
                raise ValueError(f"{part!r}: {name} must be in {'(' if low_open else '['}{low:g}, {high:g}]")
            values[name] = value
        return replace(self.lossless(), **values)

    def steps_for(self, steps: int) -> int:
        """Denoising steps actually run for a video that asked for `steps`."""
        return steps if self.step_scale == 1.0 else max(1, round(steps * self.step_scale))

    def guided_steps(self, steps: int) -> int | None:
        """How many of `steps` get classifier-free guidance; None for all of them."""
        return None if self.guidance_fraction >= 1.0 else max(1, round(steps * self.guidance_fraction))

    def offloads_text_encoder(self) -> bool:
        return self.offload_text_encoder and self.text_cache and self.torch_device().type != "cpu"

    def torch_device(self) -> torch.device:
        import torch  # here, not at the top: the job system reads this config in commands that never render

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        import torch  # see torch_device

        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]
