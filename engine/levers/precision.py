"""Lower precision as a lossy lever: a registration's `precision:` (or REELBATCH_PRECISION), what it costs in weight
bytes, what a device can run, and the transformer quantized with torchao.

Modes: `fp32`, `bf16`, `fp16` (the whole pipeline in that float type, the VAE in fp32 as always), and three 8-bit
ones that quantize the transformer(s) only and compute in the device's native float type:
- `int8-weight`: int8 weights with one scale per output row (torchao Int8WeightOnlyConfig), activations in float.
- `int8`: int8 weights and int8 activations quantized per token at run time (Int8DynamicActivationInt8WeightConfig).
- `fp8`: float8 (e4m3) weights and activations, per-row scales (Float8DynamicActivationFloat8WeightConfig); its
  matmuls need FP8 tensor cores, so it runs only on CUDA devices of compute capability 8.9 or above (Ada, Hopper,
  Blackwell) and is refused elsewhere.
`auto` is the device's native precision: bf16 on a GPU, fp32 on a CPU (EngineConfig.torch_dtype).

torchao is PyTorch's own quantization library: its configs replace each Linear's weight by a tensor subclass whose
matmul dispatches to int8/fp8 kernels (torch._int_mm, torch._scaled_mm), so the diffusers model, its hooks and
torch.compile keep working unchanged; no kernel is written here.

Only the transformer's Linear layers are quantized; the layers in KEEP stay in float, as do its norms, its patch
embedding (a Conv3d), the text encoder and the VAE (KEEP below says why and where it was measured). The text encoder
has a mode of its own (a registration's `text_encoder_precision:`, text_encoder_mode): a float mode loads it in that
type, an 8-bit one quantizes its Linear layers as above; its memory matters more than its time (UMT5-XXL is 11 GB in
bf16, and encodes each distinct prompt once: engine.levers.text_cache), and it is gated like the transformer's.

A mode other than the native one or fp32 changes output bits, so it is a lossy setting like the step cache: the
engine uses it only behind a passing quality gate recorded for that model and that mode (engine.levers.gates, setting
`precision=MODE`). This module imports torch only inside the functions that need it: the registry and the settings
read MODES at submit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.errors import RenderError

if TYPE_CHECKING:
    import torch

FLOATS = ("fp32", "bf16", "fp16")
EIGHT_BIT = ("int8-weight", "int8", "fp8")
# What a registration and REELBATCH_PRECISION accept.
MODES = ("auto", *FLOATS, *EIGHT_BIT)
# EngineConfig.precision's value that puts every model at its native precision, whatever its registration says: the
# exact mode a gate measures a precision against (EngineConfig.lossless, .exact).
NATIVE = "native"
# The transformer layers kept in float under an 8-bit mode, by name prefix. The output projection (proj_out): it is
# 0.1% of the bytes (1536 x 64 in Wan 2.1) and its error lands on the predicted velocity with nothing after it; on
# the toy model it is the group whose int8 error is least (54.3 dB mean PSNR alone), so it is kept for its price,
# not its error. The condition embedder (timestep and text projections) is quantized: it is 17% of the `cpu`
# preset's 2-block transformer (time_proj alone 14.2M of 112.8M parameters), so keeping it in fp32 would leave the
# 8-bit modes at 0.38x of fp32's bytes there. Measured by layer group on the toy model's gate (32 videos at int8,
# each group alone): self-attention 47.4 dB, condition embedder 49.1, feed-forward 50.5, output projection 54.3,
# cross-attention 54.7, every Linear 44.6; `int8-weight` passes the gate with this list and `int8` fails it by one
# flipped verdict of 32, as it still does with the condition embedder or the self-attention also kept (45.0 and
# 46.3 dB), so neither is worth its bytes. docs/PERFORMANCE.md, "Lower precision"; scripts/precision_keep.py
# --groups, scripts/precision_keep_gate.py.
KEEP = ("proj_out",)
# FP8 matmuls (torch._scaled_mm) need FP8 tensor cores: compute capability 8.9 (Ada) or above.
FP8_CAPABILITY = (8, 9)
SETTING = "precision"
# The text encoder's own mode (a registration's `text_encoder_precision:`, or `bench quality --setting
# text_encoder_precision=MODE`): its gate key part, after the accelerators' and before `precision=MODE`.
TEXT_ENCODER_SETTING = "text_encoder_precision"
# The text encoder's Linear layers kept in float under an 8-bit mode: none. Its embedding table and relative
# position biases are nn.Embedding and its norms T5LayerNorm, none of them a Linear, so they stay in float anyway
# (the table is 18% of UMT5-XXL's 5.7B parameters, so its 8-bit weights are about 0.38x of its float ones, not
# 0.25x). Measured: docs/PERFORMANCE.md, "The text encoder on its own".
TEXT_ENCODER_KEEP: tuple[str, ...] = ()


def recipe(setting: str) -> str:
    """What decides a gated setting's 8-bit numbers besides its modes: the layers each 8-bit mode keeps in float (KEEP,
    TEXT_ENCODER_KEEP) and the quantization library's version. A gate records it (engine.levers.gates.Gate.recipe), and
    a record measured under another recipe releases nothing: changing KEEP, or upgrading torchao, asks for the gate
    again. "" for a setting with no 8-bit mode."""
    parts = []
    for part in setting.split(","):
        name, _, mode = part.partition("=")
        if mode in EIGHT_BIT and name == SETTING:
            parts.append(f"transformer keeps {'+'.join(KEEP) or 'nothing'} in float")
        elif mode in EIGHT_BIT and name == TEXT_ENCODER_SETTING:
            parts.append(f"text encoder keeps {'+'.join(TEXT_ENCODER_KEEP) or 'nothing'} in float")
    if not parts:
        return ""
    from importlib.metadata import PackageNotFoundError, version

    try:
        library = f"torchao {version('torchao')}"
    except PackageNotFoundError:
        library = "torchao not installed"
    return "; ".join([*parts, library])


class PrecisionRefused(RenderError):
    """A registration's precision cannot run on this device (fp8 without FP8 units)."""


def check_mode(value: object) -> str:
    """`value` if it is a mode, else ValueError saying which are."""
    if value not in MODES:
        raise ValueError(f"precision must be one of {', '.join(MODES)}, got {value!r}")
    return str(value)


def mode_for(config_precision: str, registered: str | None) -> str:
    """The mode a model renders at: its registration's, else the engine's default; NATIVE overrides both."""
    if config_precision == NATIVE:
        return "auto"
    return registered or config_precision


def text_encoder_mode(config_value: str | None, registered: str | None) -> str | None:
    """The mode the text encoder runs at on its own, or None: as the pipeline (a float mode's type, the native one
    under an 8-bit mode). EngineConfig.text_encoder_precision (a gate's measured mode; NATIVE in exact mode) over
    the registration's."""
    if config_value == NATIVE:
        return None
    return config_value or registered


def native(dtype: torch.dtype) -> str:
    """The float mode of the engine's native dtype (EngineConfig.torch_dtype)."""
    import torch

    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def resolve(mode: str, native_mode: str) -> str:
    return native_mode if mode in ("auto", NATIVE) else mode


def lossy(mode: str, native_mode: str | None) -> bool:
    """Whether `mode` changes output bits against the native precision: anything but native or fp32. With no device
    (`native_mode` None, e.g. at submit, where the workers' device is unknown): the modes lossy on every device."""
    if native_mode is None:
        return mode in ("fp16", *EIGHT_BIT)
    return resolve(mode, native_mode) not in (native_mode, "fp32")


def gate_setting(lossy_accelerators: str, mode: str, native_mode: str | None, text_mode: str | None = None) -> str:
    """The key a gate is recorded and checked under: the lossy accelerators (EngineConfig.lossy) and, each where
    lossy, `text_encoder_precision=MODE` (the text encoder's own mode, text_encoder_mode) and `precision=MODE` (""
    when none)."""
    parts = [lossy_accelerators] if lossy_accelerators else []
    if text_mode is not None and lossy(text_mode, native_mode):
        parts.append(f"{TEXT_ENCODER_SETTING}={resolve(text_mode, native_mode or 'fp32')}")
    if lossy(mode, native_mode):
        parts.append(f"{SETTING}={resolve(mode, native_mode or 'fp32')}")
    return ",".join(parts)


def compute_dtype(mode: str, native_dtype: torch.dtype) -> torch.dtype:
    """The float type the pipeline loads and computes in: a float mode's own; an 8-bit mode's activations and the
    layers it keeps run in the native one."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(mode, native_dtype)


def device_problem(mode: str, device_type: str, capability: tuple[int, int] | None) -> str | None:
    """Why `mode` cannot run on a device of `device_type` ("cuda", "cpu", ...) and CUDA `capability` (None when it
    can)."""
    if mode != "fp8":
        return None
    need = f"{FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]}"
    if device_type != "cuda" or capability is None:
        return (f"fp8 needs a CUDA GPU with FP8 units (compute capability {need} or above: Ada, Hopper, Blackwell); "
                f"this device is {device_type}")
    if tuple(capability) < FP8_CAPABILITY:
        return f"fp8 needs FP8 units (compute capability {need} or above); this GPU is {capability[0]}.{capability[1]}"
    return None


def device_facts(device: str) -> tuple[str, tuple[int, int] | None]:
    """The device type and, for CUDA, its compute capability, without initialising CUDA in this process: a prefork
    worker's parent must not (CUDA does not survive fork, celery#6036), so CUDA is asked in a child process."""
    import subprocess
    import sys

    import torch

    if device.startswith(("cpu", "mps")) or (device == "auto" and torch.version.cuda is None):
        return ("cpu" if device == "auto" else device.split(":")[0]), None
    if torch.cuda.is_initialized():
        target = torch.device("cuda" if device == "auto" else device)
        return ("cuda", tuple(torch.cuda.get_device_capability(target))) if torch.cuda.is_available() else ("cpu", None)
    probe = ("import sys, torch\n"
             "d = sys.argv[1]\n"
             "if not torch.cuda.is_available(): print('cpu')\n"
             "else: print('cuda', *torch.cuda.get_device_capability(torch.device('cuda' if d == 'auto' else d)))\n")
    out = subprocess.run([sys.executable, "-c", probe, device], capture_output=True, text=True, timeout=120)
    words = out.stdout.split()
    if out.returncode != 0 or not words:
        raise RenderError(f"device {device!r}: cannot read its compute capability: {out.stderr.strip()[-500:]}")
    return (words[0], (int(words[1]), int(words[2]))) if words[0] == "cuda" else ("cpu", None)


def _torchao_config(mode: str):
    # torchao 0.18's names; imported here so that only an 8-bit render pays for torchao's import, which logs a
    # warning for each of its CUDA-only kernel libraries a CPU build of torch cannot load: quieted, not needed.
    quiet = logging.getLogger("torchao")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import torchao.quantization  # noqa: F401
    finally:
        quiet.setLevel(level)
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        PerRow,
    )

    if mode == "int8-weight":
        return Int8WeightOnlyConfig()
    if mode == "int8":
        return Int8DynamicActivationInt8WeightConfig()
    return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())


def quantize(model: torch.nn.Module, mode: str, keep: tuple[str, ...] | None = None) -> int:
    """Quantize `model`'s Linear layers in place to an 8-bit `mode`, except those whose name starts with one of
    `keep` (default KEEP, read at the call: scripts/precision_keep.py measures other choices). Returns how many
    layers were quantized."""
    import torch
    from torchao.quantization import quantize_

    keep = KEEP if keep is None else keep

    chosen = {name for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and not name.startswith(keep)}
    quantize_(model, _torchao_config(mode), filter_fn=lambda m, fqn: fqn in chosen)
    return len(chosen)


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes a tensor holds: a quantized tensor subclass's inner tensors (int8 data, scales, zero points)."""
    if hasattr(t, "__tensor_flatten__"):  # plain tensors and parameters have none
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes of `model`'s parameters and buffers, as they are held (quantized or not)."""
    seen: set[int] = set()
    total = 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += tensor_bytes(t)
    return total
