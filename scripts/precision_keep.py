"""Which transformer layers an 8-bit mode keeps in float (engine.levers.precision.KEEP), measured on the toy model: its
quality sample set rendered at native precision (exact mode) and at each 8-bit mode with each choice of kept
layers, and the PSNR of each to exact, with the transformer's weight bytes.

    PYTHONPATH=$PWD python scripts/precision_keep.py [COUNT [MODE ...]]   # one JSON object per line
    PYTHONPATH=$PWD python scripts/precision_keep.py --groups [COUNT [MODE ...]]

--groups quantizes one layer group at a time (the rest in float): the condition embedder (timestep and text
projections), the blocks' self-attention, cross-attention and feed-forward Linears, the output projection; and then
every Linear. Its error per group says where an 8-bit mode's loss comes from, and so which group to keep in float.

The toy model is trained, so its frames are smooth and a PSNR means what it means on a real model; a random-weight
model's noise would exaggerate every error. docs/PERFORMANCE.md, "Lower precision", records the result.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import numpy as np

from engine.engine import Engine
from engine.frames.metrics import psnr
from engine.levers import precision
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from jobs.quality.evaluate import native_shape, render_cases
from jobs.quality.sample import sample_set
from jobs.settings import Settings

CHOICES = {"nothing": (), "proj_out": ("proj_out",), "condition_embedder": ("condition_embedder",),
           "both (KEEP)": ("proj_out", "condition_embedder")}


GROUPS = ("condition_embedder", "attn1", "attn2", "ffn", "proj_out")


def group_of(name: str) -> str:
    parts = name.split(".")
    return parts[2] if parts[0] == "blocks" else parts[0]


def only(group: str | None, linears: list[str]) -> tuple[str, ...]:
    """The keep list (full Linear names, matched as prefixes by precision.quantize) that quantizes `group` alone
    (None: every Linear)."""
    return tuple(n for n in linears if group is not None and group_of(n) != group)


def main(count: int, modes: list[str], groups: bool = False) -> None:
    settings = Settings.from_env()
    registry: Registry = settings.registry()
    shape, _ = native_shape(registry, "toy")
    cases = sample_set(count)
    base = EngineConfig(cache_dir=settings.engine.cache_dir).exact()
    started = time.perf_counter()
    exact = render_cases(Engine(base, registry), shape, cases, count)
    print(json.dumps({"mode": "exact", "seconds": round(time.perf_counter() - started, 2)}), flush=True)
    choices = CHOICES
    if groups:
        import torch

        transformer = Engine(base, registry).pipeline("toy").transformer
        linears = [n for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)]
        choices = {f"only {g}": only(g, linears) for g in GROUPS} | {"every Linear": only(None, linears)}
    for mode in modes:
        for name, keep in choices.items():
            precision.KEEP = keep
            # Exact switches at this mode; measuring, so its gate is not asked.
            engine = Engine(dataclasses.replace(base, precision=mode), registry, measuring=["toy"])
            started = time.perf_counter()
            videos = render_cases(engine, shape, cases, count)
            seconds = time.perf_counter() - started
            scores = [psnr(v, e) for v, e in zip(videos, exact)]
            bytes_ = precision.weight_bytes(engine.pipeline("toy").transformer)
            print(json.dumps({"mode": mode, "quantized" if groups else "kept": name, "psnr_db_mean": round(float(np.mean(scores)), 2),
                              "psnr_db_min": round(float(min(scores)), 2), "weight_bytes": bytes_,
                              "seconds": round(seconds, 2)}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    by_group = bool(args) and args[0] == "--groups"
    args = args[1:] if by_group else args
    main(int(args[0]) if args else 8, args[1:] or ["int8-weight", "int8"], by_group)
