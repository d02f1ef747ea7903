"""`reelbatch bench precision`: exact mode, the native engine and a mode side by side on the shipped toy model, with
the transformer's and the text encoder's bytes as held, from the CLI."""

import json
import os
import subprocess
import sys

import pytest

from jobs.cli.bench_precision import print_precision_bench
from jobs.cli.console import out


def cli(args, cwd, env, timeout=900):
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def env(tmp_path, model_cache):
    """A cache folder of this test's own (no gate recorded); the toy model is the repository's."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
            "REELBATCH_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "240"}


# The toy text encoder (engine/models/toy/text_encoder/config.json: UMT5, vocab 259, d_model 64, d_ff 128, 4 heads of
# 16, 2 layers, 16 buckets). Per layer: q, k, v, o 4 * 64*64 = 16,384; wi_0, wi_1 2 * 64*128 = 16,384; wo 128*64 =
# 8,192; two norms 2 * 64 and its position biases 16*4 = 64: 41,152. The table 259*64 = 16,576, the final norm 64.
# fp32: (16,576 + 2 * 41,152 + 64) * 4 = 98,944 * 4 = 395,776 bytes.
TEXT_FP32 = 395_776
# int8 weights: the 14 Linears' 2 * 40,960 = 81,920 weights a byte each, with a float32 scale and an int8 zero point
# for each of their 2 * (4*64 + 2*128 + 64) = 1,152 output rows: 5,760; the table, norms and biases stay fp32:
# (16,576 + 2 * (2*64 + 64) + 64) * 4 = 68,096. 81,920 + 5,760 + 68,096 = 155,776 (0.39x).
TEXT_INT8 = 155_776


def test_bench_precision_puts_a_mode_beside_exact_and_native_with_both_models_bytes(tmp_path, env):
    proc = cli(["bench", "precision", "int8-weight", "--text-encoder", "int8-weight", "--preset", "small",
                "--videos", "2", "--steps", "2", "--json"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["model"], r["shape"]["videos"], r["shape"]["steps"]) == ("toy", 2, 2)
    exact, native, mode = r["sides"]
    assert [s["name"] for s in r["sides"]] == ["exact", "native", "int8-weight"]
    assert [(s["precision"], s["text_encoder_precision"], s["text_encoder_bytes"]) for s in r["sides"]] == [
        ("fp32", "fp32", TEXT_FP32), ("fp32", "fp32", TEXT_FP32), ("int8-weight", "int8-weight", TEXT_INT8)]
    # Every Linear but the output projection (engine.levers.precision.KEEP) in a byte a weight: well under half of
    # fp32's.
    assert exact["weight_bytes"] == native["weight_bytes"] and mode["weight_bytes"] < 0.5 * native["weight_bytes"]
    assert exact["psnr_db_min"] is None and native["psnr_db_min"] is not None and mode["psnr_db_min"] is not None
    # This cache has no gate: the mode is timed, and the side says a worker would refuse it.
    assert (exact["gate"], native["gate"]) == ("native", "native") and mode["gate"].startswith("workers refuse it")

    # The table the command prints without --json, from the same result (printing renders nothing).
    width, out.width = out.width, 240
    try:
        with out.capture() as printed:
            print_precision_bench(r)
    finally:
        out.width = width
    row = next(line.split() for line in printed.get().splitlines() if line.split()[:1] == ["int8-weight"])
    assert "0.39x" in row and "int8-weight" in row[1:], row  # the text encoder's bytes, of fp32's


def test_an_unknown_text_encoder_mode_is_refused_before_rendering(tmp_path, env):
    proc = cli(["bench", "precision", "bf16", "--text-encoder", "int4", "--preset", "small"], tmp_path, env,
               timeout=300)
    assert proc.returncode == 2 and "--text-encoder: precision must be one of auto" in " ".join(proc.stderr.split())
