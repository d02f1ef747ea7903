"""Which transformer layers an 8-bit mode keeps in float (engine.precision.KEEP), measured on the toy model: its
quality sample set rendered at native precision (exact mode) and at each 8-bit mode with each choice of kept
layers, and the PSNR of each to exact, with the transformer's weight bytes.

    PYTHONPATH=$PWD python scripts/precision_keep.py [COUNT [MODE ...]]   # one JSON object per line

The toy model is trained, so its frames are smooth and a PSNR means what it means on a real model; a random-weight
model's noise would exaggerate every error. docs/SPEED.md records the result.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import numpy as np

from engine import precision
from engine.config import EngineConfig
from engine.engine import Engine
from engine.metrics import psnr
from engine.models import Registry
from jobs.quality.evaluate import native_shape, render_cases
from jobs.quality.sample import sample_set
from jobs.settings import Settings

CHOICES = {"nothing": (), "proj_out": ("proj_out",), "condition_embedder": ("condition_embedder",),
           "both (KEEP)": ("proj_out", "condition_embedder")}


def main(count: int, modes: list[str]) -> None:
    settings = Settings.from_env()
    registry: Registry = settings.registry()
    shape, _ = native_shape(registry, "toy")
    cases = sample_set(count)
    base = EngineConfig(cache_dir=settings.cache_dir).exact()
    started = time.perf_counter()
    exact = render_cases(Engine(base, registry), shape, cases, count)
    print(json.dumps({"mode": "exact", "seconds": round(time.perf_counter() - started, 2)}), flush=True)
    for mode in modes:
        for name, keep in CHOICES.items():
            precision.KEEP = keep
            # Exact switches at this mode; measuring, so its gate is not asked.
            engine = Engine(dataclasses.replace(base, precision=mode), registry, measuring=["toy"])
            started = time.perf_counter()
            videos = render_cases(engine, shape, cases, count)
            seconds = time.perf_counter() - started
            scores = [psnr(v, e) for v, e in zip(videos, exact)]
            bytes_ = precision.weight_bytes(engine.pipeline("toy").transformer)
            print(json.dumps({"mode": mode, "kept": name, "psnr_db_mean": round(float(np.mean(scores)), 2),
                              "psnr_db_min": round(float(min(scores)), 2), "weight_bytes": bytes_,
                              "seconds": round(seconds, 2)}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8, sys.argv[2:] or ["int8-weight", "int8"])
