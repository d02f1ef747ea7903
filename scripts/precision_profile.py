"""Where an 8-bit transformer call spends its time on this machine: one call of the `cpu` preset's transformer
(Wan2.1-1.3B widths, 2 blocks; built by `reelbatch bench --preset cpu` into REELBATCH_CACHE_DIR) at the preset's
shape (a guided batch of 2 videos of 128x128, 17 frames: 2 x 320 tokens; 512 text tokens), at fp32 and each asked
mode, under torch.profiler; prints each mode's wall seconds (best of ROUNDS) and its top operators by CPU time.

    PYTHONPATH=$PWD python scripts/precision_profile.py [MODE ...]      # default: fp32 int8-weight int8

docs/PERFORMANCE.md, "Lower precision", records what it showed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from engine.levers import precision
from engine.models.loading import pipeline_class  # noqa: F401 - quiets torchao's import warnings (engine.models.loading)
from jobs.settings import Settings

ROUNDS = 3


def main(modes: list[str]) -> None:
    from diffusers import WanTransformer3DModel

    folder = Path(Settings.from_env().engine.cache_dir) / "models" / "bench-wan-widths-v1" / "transformer"
    torch.manual_seed(0)
    # 17 frames -> 5 latent frames; 128x128 -> 16x16 latents -> 8x8 patches: 320 tokens a video.
    latents = torch.randn(2, 16, 5, 16, 16)
    text = torch.randn(2, 512, 256)
    timestep = torch.tensor([500.0, 500.0])
    for mode in modes:
        model = WanTransformer3DModel.from_pretrained(folder, torch_dtype=precision.compute_dtype(mode, torch.float32))
        if mode in precision.EIGHT_BIT:
            precision.quantize(model, mode)
        dtype = precision.compute_dtype(mode, torch.float32)
        args = dict(hidden_states=latents.to(dtype), timestep=timestep, encoder_hidden_states=text.to(dtype),
                    return_dict=False)
        with torch.no_grad():
            model(**args)  # warm-up
            times = []
            for _ in range(ROUNDS):
                started = time.perf_counter()
                model(**args)
                times.append(time.perf_counter() - started)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(**args)
        print(f"== {mode}: best {min(times):.3f} s of {ROUNDS}, weights {precision.weight_bytes(model) / 1e6:.1f} MB")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main(sys.argv[1:] or ["fp32", "int8-weight", "int8"])
