"""The text encoder on its own (a registration's `text_encoder_precision:`, engine.levers.precision.text_encoder_mode):
its weight bytes at each mode, and how far its embeddings of the gate's sample prompts move from native precision's.

    PYTHONPATH=$PWD python scripts/text_encoder_precision.py [MODEL [COUNT]]   # one JSON object per line

MODEL: `toy` (trained; the default) or `tiny` (random weights). COUNT prompts of the toy quality set (16). The
relative error is ||e - e_native|| / ||e_native|| over each prompt's embedding, the worst and the mean;
docs/PERFORMANCE.md, "The text encoder on its own", records the result.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

from engine.engine import Engine
from engine.levers import precision
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from jobs.quality.sample import sample_set
from jobs.settings import Settings

MODES = ("native", "bf16", "fp16", "int8-weight", "int8")


def main(model: str, count: int) -> None:
    settings = Settings.from_env()
    registry: Registry = settings.registry()
    info = registry.get(model)
    texts = [c.prompt for c in sample_set(count)]
    config = dataclasses.replace(EngineConfig(cache_dir=settings.engine.cache_dir), text_cache=False)
    native = None
    for mode in MODES:
        at = Registry({model: dataclasses.replace(info, text_encoder_precision=None if mode == "native" else mode)})
        engine = Engine(config, at, measuring=[model])
        pipe = engine.pipeline(model)
        with torch.no_grad():
            embeds = pipe.encode_prompt(texts, do_classifier_free_guidance=False,
                                        max_sequence_length=info.max_sequence_length, device="cpu")[0].float()
        if native is None:
            native = embeds
        err = ((embeds - native).flatten(1).norm(dim=1) / native.flatten(1).norm(dim=1)).tolist()
        linears = sum(isinstance(m, torch.nn.Linear) for m in pipe.text_encoder.modules())
        print(json.dumps({"model": model, "mode": mode, "text_encoder_bytes": precision.weight_bytes(pipe.text_encoder),
                          "linears": linears, "relative_error_max": round(max(err), 5),
                          "relative_error_mean": round(sum(err) / len(err), 5), "prompts": len(texts)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "toy", int(sys.argv[2]) if len(sys.argv) > 2 else 16)
