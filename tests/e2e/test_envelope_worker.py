"""A new worker on the job path (issue 43): with `--envelope measure --warm` it measures its device's memory envelope
of the model before its first claim and keeps it in the database, renders one step of the waiting shape, then
renders the run; its metrics say how long after its start the model was loaded and the first video stored, and its
session keeps that cold start for `reelbatch scale`."""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.request

from tests.e2e.conftest import Cli, base_env
from tests.e2e.procs import Workers, wait_for
from tests.services import free_port

MANIFEST = ("name: env\nmodel: tiny\ndefaults: {steps: 2, resolution: 64x64, duration_s: 1}\n"
            "videos:\n" + "".join(f"  - {{id: v{i}, prompt: a red circle, seed: {i}}}\n" for i in range(3)))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def gauge(text: str, stage: str) -> float | None:
    found = re.search(rf'^reelbatch_cold_start_seconds{{stage="{stage}"}} ([0-9.e+-]+)$', text, re.M)
    return float(found.group(1)) if found else None


def test_a_worker_measures_its_envelope_warms_up_and_reports_its_cold_start(tmp_path, model_cache):
    (tmp_path / "env.yaml").write_text(MANIFEST)
    port = free_port()
    env = {**base_env(model_cache), "REELBATCH_METRICS_PORT": str(port)}
    Cli(tmp_path, env)("submit", "env.yaml")
    done = tmp_path / "outputs" / "env" / "results.jsonl"
    with Workers(env, tmp_path) as workers:
        worker = workers.start(args=("--models", "tiny", "--envelope", "measure", "--warm"))
        wait_for("the videos", lambda: done.exists() and len(done.read_text().splitlines()) == 3, timeout=900,
                 interval=1, diagnose=workers.tails)
        metrics = wait_for("the first video's gauge", lambda: gauge(text := scrape(port), "first_video") and text,
                           timeout=60, diagnose=workers.tails)
        log = worker.log.read_text(errors="replace")
    assert all(json.loads(line)["status"] == "succeeded" for line in done.read_text().splitlines())
    loaded, first = gauge(metrics, "model_loaded"), gauge(metrics, "first_video")
    assert 0 < loaded <= first < 900, (loaded, first)
    assert "memory envelope of tiny on cpu: " in log and "warmed up ahead for ['tiny|64x64|f9|s2|g5']" in log, \
        log[-3000:]
    assert log.index("memory envelope of tiny") < log.index("warmed up ahead") < log.index("claimed ")
    with sqlite3.connect(tmp_path / "reelbatch.db") as db:
        rows = db.execute("SELECT model, device, ooms, points FROM envelopes").fetchall()
        (cold,) = db.execute("SELECT cold_start_s FROM worker_sessions WHERE cold_start_s IS NOT NULL").fetchone()
    # The session keeps the same first-video figure the gauge shows (`reelbatch scale` takes its median).
    assert abs(cold - first) < 0.5, (cold, first)
    assert [(m, d.startswith("cpu: "), o, len(json.loads(p))) for m, d, o, p in rows] == [("tiny", True, 0, 4)]
