"""A scale-down drill (issue 43): two real workers render a run while a real Prometheus server (Debian's package)
scrapes both; an autoscaler that trusts only what reelbatch shows (`reelbatch scale --json` and Prometheus's
`reelbatch_worker_busy`) stops one worker, and only one that both read idle, while the other still renders. The
stopped worker drains and exits 0; every video is stored once, on its first attempt, charged once (its render and
its object); Prometheus holds
the desired-workers gauge the workers' sweeper published.

The run: six 2-step videos at priority 5, then one 60-step 192x192 video of 33 frames at priority 0, claimed last
and long enough that one worker is idle while the other renders it: a 60-step 128x128 video of 9 frames rendered in
2.4 s on a loaded 2-core machine, shorter than one look of the autoscaler (a `reelbatch scale` process and a
Prometheus query), and the drill waited out its 900 s for a moment that had passed; this one takes about ten times
as long."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.e2e.conftest import Cli, base_env
from tests.e2e.procs import Workers, wait_for
from tests.services import free_port

SHORT = ("name: short\nmodel: tiny\npriority: 5\ndefaults: {steps: 2, resolution: 64x64, duration_s: 1}\nvideos:\n"
         + "".join(f"  - {{id: s{i}, prompt: a red circle moving right, seed: {i}}}\n" for i in range(6)))
TAIL = ("name: tail\nmodel: tiny\npriority: 0\ndefaults: {steps: 60, resolution: 192x192, duration_s: 4}\nvideos:\n"
        "  - {id: t0, prompt: a blue square moving left, seed: 9}\n")


def start_prometheus(folder, targets: list[int]) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed (apt-get install prometheus; scripts/test.sh installs it)")
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
                      "  - job_name: reelbatch\n    static_configs:\n"
                      f"      - targets: [{', '.join(repr(f'127.0.0.1:{p}') for p in targets)}]\n")
    log = open(folder / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_for("prometheus", lambda: _get(f"{url}/-/ready"), timeout=60,
             diagnose=lambda: (folder / "prometheus.log").read_text(errors="replace")[-2000:])
    return proc, url


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()
    except OSError:
        return None


def query(url: str, promql: str) -> dict[str, float]:
    """instance -> value of an instant query."""
    body = _get(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}")
    if body is None:
        return {}
    found = json.loads(body)["data"]["result"]
    return {r["metric"]["instance"]: float(r["value"][1]) for r in found}


def test_a_scale_down_stops_only_an_idle_worker_and_loses_nothing(tmp_path, model_cache):
    (tmp_path / "short.yaml").write_text(SHORT)
    (tmp_path / "tail.yaml").write_text(TAIL)
    env = {**base_env(model_cache), "REELBATCH_LEASE_S": "8", "REELBATCH_MAX_BATCH": "1"}
    cli = Cli(tmp_path, env)
    cli("submit", "short.yaml")
    cli("submit", "tail.yaml")
    ports = [free_port(), free_port()]
    prom, url = start_prometheus(tmp_path, ports)
    try:
        with Workers(env, tmp_path) as workers:
            started = [workers.start(env={"REELBATCH_METRICS_PORT": str(p)}) for p in ports]
            by_pid = {w.pid: (w, f"127.0.0.1:{p}") for w, p in zip(started, ports, strict=True)}
            stopped = None
            deadline = time.monotonic() + 900
            done = tmp_path / "outputs"
            while stopped is None and time.monotonic() < deadline:
                if all((done / r / "results.jsonl").exists() for r in ("short", "tail")):
                    break  # every video stored: the moment can no longer come
                shown = json.loads(cli("scale", "--json").stdout)
                busy = query(url, "reelbatch_worker_busy")
                live = {int(w["owner"].rsplit(":", 1)[1]): w for w in shown["workers"]}
                idle = [pid for pid, w in live.items() if pid in by_pid and not w["busy"]
                        and busy.get(by_pid[pid][1]) == 0.0]
                others_busy = [pid for pid, w in live.items() if pid in by_pid and w["busy"]]
                if shown["models"] and idle and others_busy and len(live) == 2:
                    stopped = by_pid[idle[0]][0]
                    kept = by_pid[others_busy[0]][0]
                    stopped.signal(signal.SIGTERM)  # the scale-down: `kubectl scale`, `systemctl stop`
                    break
                time.sleep(0.3)
            assert stopped is not None, "no moment came with one worker idle and the other rendering\n" + \
                workers.tails()
            assert stopped.proc.wait(timeout=120) == 0, stopped.tail()
            assert kept.alive(), kept.tail()
            wait_for("every video", lambda: all((done / r / "results.jsonl").exists() for r in ("short", "tail")),
                     timeout=900, interval=1, diagnose=workers.tails)
            desired = wait_for("the desired-workers series",
                               lambda: query(url, 'max_over_time(reelbatch_desired_workers{model="tiny"}[10m])'),
                               timeout=60)
    finally:
        prom.terminate()
        prom.wait(timeout=30)
    assert max(desired.values()) >= 1.0, desired  # per scraped worker: each publishes what the sweep saw
    with sqlite3.connect(tmp_path / "reelbatch.db") as db:
        videos = db.execute("SELECT key, status, attempts FROM videos ORDER BY key").fetchall()
        charges = db.execute("SELECT kind, count(*) FROM cost_records GROUP BY kind").fetchall()
    assert videos == [(f"s{i}", "succeeded", 1) for i in range(6)] + [("t0", "succeeded", 1)]
    assert charges == [("gpu", 7), ("storage", 7)]  # one render and one object each: no retry, no lost attempt
    stored = sorted(p.name for p in (tmp_path / "outputs").rglob("*.mp4"))
    assert stored == sorted([f"s{i}.mp4" for i in range(6)] + ["t0.mp4"])
