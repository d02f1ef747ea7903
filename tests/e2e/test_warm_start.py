"""Warm starts on the job path: two `reelbatch run`s with compile on, as two new machines would be (each its own
folder, database and Inductor cache), sharing only REELBATCH_WARM_URI. The first compiles and stores the shape's
bundle; the second unpacks it before its warm-up, its Inductor finds every graph it needs in the cache, and the two
store the same bytes."""

from __future__ import annotations

import json
import re

from tests.e2e.conftest import Cli, base_env
from tests.e2e.procs import Workers, wait_for

MANIFEST = ("name: warm\nmodel: tiny\ndefaults: {steps: 2, resolution: 64x64, duration_s: 1}\n"
            "videos:\n  - {id: a, prompt: a red circle, seed: 3}\n")


def test_a_second_machine_starts_warm_from_the_first_ones_bundle(tmp_path, model_cache):
    warm = tmp_path / "warm"
    results = {}
    logs = {}
    for machine in ("first", "second"):
        cwd = tmp_path / machine
        cwd.mkdir()
        (cwd / "warm.yaml").write_text(MANIFEST)
        env = {**base_env(model_cache), "REELBATCH_COMPILE": "1", "REELBATCH_WARM_URI": f"file://{warm}/",
               "TORCHINDUCTOR_CACHE_DIR": str(cwd / "inductor")}
        Cli(cwd, env)("submit", "warm.yaml")
        done = cwd / "outputs" / "warm" / "results.jsonl"
        with Workers(env, cwd) as workers:
            worker = workers.start()
            wait_for("the video", done.exists, timeout=900, interval=1, diagnose=workers.tails)
            logs[machine] = worker.log.read_text(errors="replace")
        (line,) = done.read_text().splitlines()
        results[machine] = json.loads(line)
    (bundle,) = (warm / "tiny").iterdir()
    assert re.fullmatch(r"[0-9a-f]{32}\.tar", bundle.name) and bundle.stat().st_size > 10_000
    assert f"warm start: stored {bundle.as_uri()}" in logs["first"], logs["first"][-3000:]
    assert "warm start: unpacked" not in logs["first"]
    assert "warm start: unpacked" in logs["second"] and "warm start: stored" not in logs["second"], \
        logs["second"][-3000:]
    assert results["first"]["sha256"] == results["second"]["sha256"]
