"""The baseline side of `reelbatch bench`: the script a user would write from the diffusers docs (load WanPipeline
once, call it per prompt, encode, store), with its stages timed; and the machine's limit it is measured against (a
large matmul's peak, and the denoiser's FLOPs counted by torch)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from jobs.bench.presets import Preset
from jobs.bench.side import Side
from storage.encode import encode_mp4
from storage.stores import open_store


def measure_peak_gflops(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> float:
    """Best-of-`repeats` GFLOP/s of one n x n matmul: what this machine's matmul units deliver in this dtype."""
    n = n or (8192 if device.type == "cuda" else 4096)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for i in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        if i:  # the first is warm-up
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def denoise_gflop(pipe, preset: Preset, device: torch.device, *, steps: int | None = None,
                  guidance: float | None = None) -> float:
    """GFLOP of one video's denoising: one transformer call counted by FlopCounterMode, times steps, times two when
    classifier-free guidance runs a second pass (the preset's steps and guidance unless given)."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    t = pipe.transformer
    spatial, temporal = pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal
    latent = torch.zeros(1, t.config.in_channels, (preset.frames - 1) // temporal + 1, preset.height // spatial,
                         preset.width // spatial, device=device, dtype=t.dtype)
    text = torch.zeros(1, preset.max_sequence_length, t.config.text_dim, device=device, dtype=t.dtype)
    # torch counts the GPU attention kernels but not the CPU one; give it the same formula.
    aten = torch.ops.aten
    def cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    counter = FlopCounterMode(display=False,
                              custom_mapping={aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention})
    with torch.inference_mode(), counter:
        t(latent, torch.tensor([500.0], device=device), text, return_dict=False)
    guidance = preset.guidance if guidance is None else guidance
    passes = 2 if guidance > 1.0 else 1
    return counter.get_total_flops() * (steps or preset.steps) * passes / 1e9


# ---- baseline: the diffusers script --------------------------------------------------------------------------------


class _StageTimer:
    """Wraps a pipeline's encode_prompt, vae.decode and its postprocess to time them, waiting for the device at each
    end: decode and postprocess count as "decode", as the engine's decode stage holds both (and the uint8
    conversion, which run_baseline adds)."""

    def __init__(self, pipe, device: torch.device):
        self.device, self.seconds = device, {"text": 0.0, "decode": 0.0}
        pipe.encode_prompt = self._timed("text", pipe.encode_prompt)
        pipe.vae.decode = self._timed("decode", pipe.vae.decode)
        pipe.video_processor.postprocess_video = self._timed("decode", pipe.video_processor.postprocess_video)

    def _timed(self, stage: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            sync(self.device)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync(self.device)
                self.seconds[stage] += time.perf_counter() - t0

        return wrapper


def load_baseline(path: Path, device: torch.device, dtype: torch.dtype):
    """The pipeline as the diffusers docs load Wan: the VAE in fp32, the rest in the working dtype."""
    from diffusers import AutoencoderKLWan, WanPipeline

    vae = AutoencoderKLWan.from_pretrained(path, subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(path, vae=vae, torch_dtype=dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_baseline(pipe, preset: Preset, cases: list[tuple[str, int]], out: Path, device: torch.device,
                 dtype: torch.dtype, on_video: Callable[[], None] | None = None, *, steps: int | None = None,
                 guidance: float | None = None) -> tuple[Side, dict[int, tuple[np.ndarray, bytes]]]:
    """The script, at the preset's steps and guidance unless given."""
    store = open_store(out.as_uri() + "/")
    steps = steps or preset.steps
    guidance = preset.guidance if guidance is None else guidance
    uint8_s = 0.0
    # Only a two-expert pipeline takes a second scale (WanPipeline.check_inputs refuses it otherwise).
    second = {} if preset.guidance_2 is None else {"guidance_scale_2": preset.guidance_2}

    def one(prompt: str, seed: int) -> np.ndarray:
        nonlocal uint8_s
        frames = pipe(prompt=prompt, height=preset.height, width=preset.width, num_frames=preset.frames,
                      num_inference_steps=steps, guidance_scale=guidance, **second,
                      generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      max_sequence_length=preset.max_sequence_length).frames[0]
        t0 = time.perf_counter()
        frames = np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)
        uint8_s += time.perf_counter() - t0
        return frames

    one(cases[0][0] + " (warm-up)", cases[0][1] + 10**6)
    uint8_s = 0.0
    timer = _StageTimer(pipe, device)
    side = Side("baseline", config={"pipeline": "WanPipeline.__call__, one prompt per call", "dtype": str(dtype),
                                    "vae_dtype": "torch.float32", "max_sequence_length": preset.max_sequence_length})
    encode_s = upload_s = 0.0
    videos: dict[int, tuple[np.ndarray, bytes]] = {}
    started = time.perf_counter()
    for i, (prompt, seed) in enumerate(cases):
        frames = one(prompt, seed)
        t0 = time.perf_counter()
        data = encode_mp4(frames, preset.fps, preset=preset.encoder_preset)
        t1 = time.perf_counter()
        store.put(f"{i}.mp4", data, sha256=hashlib.sha256(data).hexdigest(), metadata={"seed": str(seed)})
        upload_s += time.perf_counter() - t1
        encode_s += t1 - t0
        videos[i] = (frames, data)
        if on_video:
            on_video()
    side.wall_s = time.perf_counter() - started
    side.videos = len(cases)
    pipeline_s = side.wall_s - encode_s - upload_s
    decode_s = timer.seconds["decode"] + uint8_s
    side.stages = {"text": timer.seconds["text"], "decode": decode_s, "encode": encode_s, "upload": upload_s}
    # Everything else inside the pipeline call is the denoising loop and its setup.
    side.stages["denoise"] = pipeline_s - timer.seconds["text"] - decode_s
    side.stages["other"] = 0.0
    return side, videos


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
