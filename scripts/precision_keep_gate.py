"""The toy model's quality gate (jobs.bench.quality, as `reelbatch bench quality --precision MODE`) at an 8-bit
mode with other layers kept in float than engine.levers.precision.KEEP names: which keep list lets the mode pass.

    PYTHONPATH=$PWD python scripts/precision_keep_gate.py MODE COUNT GROUP[+GROUP...] ...   # one JSON line each

A GROUP is a name prefix (proj_out, condition_embedder) or a block sublayer (attn1, attn2, ffn: in every block).
The gates are recorded in REELBATCH_CACHE_DIR (use a scratch one: the records do not say which layers were kept).
docs/PERFORMANCE.md, "Lower precision", records the result.
"""

from __future__ import annotations

import json
import sys
import time

from engine.levers import precision
from jobs.bench.quality import run_quality_bench
from jobs.settings import Settings

BLOCK_PARTS = ("attn1", "attn2", "ffn")
BLOCKS = 4  # the toy transformer's (engine/models/toy/transformer/config.json num_layers)


def prefixes(groups: str) -> tuple[str, ...]:
    out: list[str] = []
    for group in groups.split("+"):
        out += [f"blocks.{i}.{group}" for i in range(BLOCKS)] if group in BLOCK_PARTS else [group]
    return tuple(out)


def main(mode: str, count: int, choices: list[str]) -> None:
    settings = Settings.from_env()
    for groups in choices:
        precision.KEEP = prefixes(groups)
        started = time.perf_counter()
        result = run_quality_bench(settings, "toy", [""], count=count, batch=8, precisions=[mode])
        (gate,) = result.gates
        print(json.dumps({"mode": mode, "kept": groups, "count": count, "passed": gate.passed,
                          "psnr_db_mean": round(gate.psnr_db_mean, 2), "psnr_db_min": round(gate.psnr_db_min, 2),
                          "ssim_min": round(gate.ssim_min, 4), "adherence": gate.adherence,
                          "exact_adherence": result.exact_adherence, "failures": gate.failures,
                          "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
