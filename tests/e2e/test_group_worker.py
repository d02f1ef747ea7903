"""A worker of several ranks on the job path (issue 44): `reelbatch worker --ulysses 2` (and `--cfg-parallel 2`)
starts its other rank itself, claims, renders and stores a manifest's videos exactly once, and its MP4s are the
bytes a one-rank worker makes (the same guidance passes, each rank's share of the cores); `--ring 2`, not bit-exact,
takes no work until `reelbatch bench quality --setting ring=2` records its passing gate, then renders the run; a rank
killed mid-batch ends the whole worker at once (status 70), and another worker renders the batch when its lease
ends, nothing lost or duplicated; and the layout is checked at start and at submit, the setting named."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time

import pytest

from engine.models.registry import Registry
from tests.e2e.conftest import Cli, base_env
from tests.e2e.procs import Workers, wait_for

VIDEOS = "".join(f"  - {{id: v{i}, prompt: a red circle moving right, seed: {i}}}\n" for i in range(3))


def manifest(name: str, steps: int) -> str:
    return (f"name: {name}\nmodel: tiny\ndefaults: {{steps: {steps}, resolution: 64x64, duration_s: 1}}\n"
            f"videos:\n{VIDEOS}")


def results(tmp_path, name: str) -> list[dict]:
    done = tmp_path / "outputs" / name / "results.jsonl"
    return [json.loads(line) for line in done.read_text().splitlines()] if done.exists() else []


def rendered(tmp_path, env: dict, name: str, args: tuple[str, ...],
             worker_env: dict | None = None) -> tuple[dict, str]:
    """Submit run `name` and render it with one worker of `args`: {video id: its MP4's SHA-256}, the worker's log."""
    (tmp_path / f"{name}.yaml").write_text(manifest(name, 2))
    Cli(tmp_path, env)("submit", f"{name}.yaml")
    with Workers(env, tmp_path) as workers:
        worker = workers.start(args=("--models", "tiny", *args), env=worker_env)
        wait_for(f"run {name}", lambda: len(results(tmp_path, name)) == 3, timeout=600, interval=1,
                 diagnose=workers.tails)
        log = worker.text()
    found = results(tmp_path, name)
    assert [r["status"] for r in found] == ["succeeded"] * 3, found
    return {r["id"]: r["sha256"] for r in found}, log


def test_a_worker_of_two_ranks_renders_the_bytes_of_one(tmp_path, model_cache):
    # One rank as each rank of the group runs: its share of the cores (torch's threads change the float sums), and
    # the guided steps' two passes as two calls, as CFG parallel's two halves make them.
    env = {**base_env(model_cache), "REELBATCH_BATCHED_GUIDANCE": "0"}
    share = str(max(1, (os.cpu_count() or 1) // 2))
    one, alone = rendered(tmp_path, env, "one", (), {"OMP_NUM_THREADS": share})
    ulysses, split = rendered(tmp_path, env, "ulysses", ("--ulysses", "2"))
    cfg, halves = rendered(tmp_path, env, "cfg", ("--cfg-parallel", "2"))
    assert ulysses == one and cfg == one
    assert len(set(one.values())) == 3  # three seeds, three videos
    assert "group of" not in alone
    assert "group of 2 ranks ready (ulysses 2 x ring 1 x cfg 1, gloo)" in split
    assert "group of 2 ranks ready (ulysses 1 x ring 1 x cfg 2, gloo)" in halves
    assert "[rank 1] INFO engine.models.pipelines: loading model tiny" in split
    with sqlite3.connect(tmp_path / "reelbatch.db") as db:
        assert db.execute("SELECT count(*), sum(attempts) FROM work_units").fetchone() == (9, 9)  # each once


@pytest.mark.skipif("toy" not in Registry().models, reason="the toy model's weights are not in place")
def test_ring_waits_for_its_gate_then_renders(tmp_path):
    # A cache of its own: the gate this test records stays here.
    env = {**base_env(tmp_path / "cache"), "REELBATCH_WORKER_MODELS": "toy"}
    cli = Cli(tmp_path, env)
    (tmp_path / "ring.yaml").write_text("name: ring\nmodel: toy\ndefaults: {steps: 4}\nvideos:\n" + VIDEOS)
    cli("submit", "ring.yaml")
    with Workers(env, tmp_path) as workers:
        worker = workers.start(args=("--ring", "2"))
        wait_for("the ungated worker's session", lambda: "no gate for toy" in cli("status").stdout, timeout=300,
                 interval=1, diagnose=workers.tails)
        assert worker.claims() == 0 and results(tmp_path, "ring") == []
        bench = cli("bench", "quality", "--model", "toy", "--setting", "ring=2", "--count", "32", "--json")
        found = json.loads(bench.stdout)
        assert found["passed"] == ["ring=2"] and found["released"] == ["ring=2"], found
        (gate,) = found["settings"]
        assert gate["psnr_db_mean"] > 60 and gate["ssim_min"] > 0.999, gate  # one level of 255 at most, rarely
        # No restart: the worker's next sweep sees the gate, sends itself a ticket and renders the run.
        wait_for("the run", lambda: len(results(tmp_path, "ring")) == 3, timeout=600, interval=1,
                 diagnose=workers.tails)
        log = worker.text()
        wait_for("its session's record", lambda: "no gate" not in cli("status").stdout, timeout=60, interval=1)
    assert {r["status"] for r in results(tmp_path, "ring")} == {"succeeded"}
    assert "group of 2 ranks ready (ulysses 1 x ring 2 x cfg 1, gloo)" in log


def followers(pid: int) -> list[int]:
    """The rank processes a worker started (multiprocessing's spawned children)."""
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", "spawn_main"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_rank_killed_mid_batch_ends_the_group_and_another_worker_renders_the_batch(tmp_path, model_cache):
    env = {**base_env(model_cache), "REELBATCH_LEASE_S": "4"}
    (tmp_path / "kill.yaml").write_text(manifest("kill", 60))
    Cli(tmp_path, env)("submit", "kill.yaml")
    with Workers(env, tmp_path) as workers:
        group = workers.start(args=("--models", "tiny", "--ulysses", "2"))
        wait_for("the group's claim", lambda: group.claims() == 1, timeout=300, interval=0.2, diagnose=workers.tails)
        time.sleep(1.5)  # into the denoising loop: 60 steps
        assert group.mid_render(), group.tail()
        (rank1,) = followers(group.pid)
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        group.proc.wait(timeout=60)
        assert group.proc.returncode == 70, group.tail()
        assert time.monotonic() - killed < 10
        assert re.search(r"group of 2 ranks lost: rank 1 exited with -9; stopping the worker \(status 70\)",
                         group.text()), group.tail()
        assert results(tmp_path, "kill") == []  # nothing stored by the lost group
        workers.start(args=("--models", "tiny"))
        wait_for("the batch again", lambda: len(results(tmp_path, "kill")) == 3, timeout=600, interval=1,
                 diagnose=workers.tails)
    found = results(tmp_path, "kill")
    assert sorted(r["id"] for r in found) == ["v0", "v1", "v2"] and {r["status"] for r in found} == {"succeeded"}
    with sqlite3.connect(tmp_path / "reelbatch.db") as db:
        units = db.execute("SELECT status, attempts FROM work_units ORDER BY id").fetchall()
        videos = db.execute("SELECT count(*) FROM videos WHERE status = 'succeeded'").fetchone()[0]
    assert units == [("succeeded", 2)] * 3 and videos == 3  # taken twice, stored once each
    assert sorted(p.name for p in (tmp_path / "outputs" / "kill").glob("*.mp4")) == ["v0.mp4", "v1.mp4", "v2.mp4"]


def test_a_layout_that_cannot_render_is_refused_naming_the_setting(tmp_path, model_cache):
    env = base_env(model_cache)
    cli = Cli(tmp_path, env)
    # tiny's transformer has 2 attention heads (engine.models.tiny): 4 ranks cannot share them.
    (tmp_path / "small.yaml").write_text(manifest("small", 2))
    cli("submit", "small.yaml")
    heads = cli("worker", "--models", "tiny", "--ulysses", "4", check=False, timeout=120)
    assert heads.returncode == 2, heads.stderr
    assert ("REELBATCH_ULYSSES=4 (--ulysses), REELBATCH_CFG_PARALLEL=1: model tiny: ulysses 4 does not divide the "
            "transformer's 2 attention heads (each rank takes heads/4 of them): use a divisor of 2") in heads.stderr
    for args, said in [
        (("--ulysses", "2", "--gpus", "0,1"), "--gpus / REELBATCH_GPUS: this worker renders on cpu"),
        (("--ulysses", "2", "--gpus", "0"), "--gpus / REELBATCH_GPUS=0: 1 GPUs for a worker of 2 ranks"),
        (("--ulysses", "2", "--pool", "prefork", "--concurrency", "2"),
         "a worker of 2 ranks renders in one process with --pool solo --concurrency 1"),
        (("--gpus", "0,0"), "--gpus: must be GPU indices separated by commas, each once (0,1,2,3), got '0,0'"),
    ]:
        proc = cli("worker", "--models", "tiny", *args, check=False, timeout=120)
        assert proc.returncode == 2 and said in " ".join(proc.stderr.split()), (args, proc.stderr)
    # 48x48 and 9 frames on tiny: 3 latent frames of 3 x 3 patches, 27 tokens, which 2 ranks cannot split.
    (tmp_path / "odd.yaml").write_text(manifest("odd", 2).replace("64x64", "48x48"))
    odd = Cli(tmp_path, {**env, "REELBATCH_ULYSSES": "2"})("submit", "odd.yaml", check=False)
    assert odd.returncode == 2, odd.stderr
    text = " ".join(odd.stderr.split())
    assert ("odd.yaml:5: videos[0].resolution: 48x48, 9 frames a pass on tiny: REELBATCH_ULYSSES=2 (--ulysses), "
            "REELBATCH_CFG_PARALLEL=1: ulysses 2 does not divide the video's 27 latent tokens") in text, text
    assert "odd.yaml:7: videos[2].resolution: 48x48" in text, text
    with sqlite3.connect(tmp_path / "reelbatch.db") as db:
        assert db.execute("SELECT name FROM runs").fetchall() == [("small",)]  # the odd run wrote nothing
