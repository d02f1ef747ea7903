"""What a large submit over the API costs the other teams: a real `reelbatch serve` (the embedded default, or the
database and broker in the environment), team B's small run recorded, then team A posts an N-video JSONL while a
thread times team B's `GET /v1/runs` and `GET /v1/runs/small` back to back. Prints A's submit time and B's request
times (median, P95, max) before and during it.

    PYTHONPATH=$PWD .venv/bin/python scripts/measure_served_submit.py [N]

With REELBATCH_DATABASE_URL and REELBATCH_BROKER_URL set (an empty PostgreSQL database, a Redis), those are used.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.jobs.service_server import Service, embedded_env

SMALL = "name: small\nmodel: tiny\ndefaults: {steps: 2, resolution: 64x64, duration_s: 0.5}\n" \
        "videos:\n  - {id: a, prompt: one}\n  - {id: b, prompt: two}\n"


def summary(times: list[float]) -> str:
    ms = sorted(1000 * t for t in times)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return f"{len(ms)} requests, median {statistics.median(ms):.1f} ms, P95 {p95:.1f} ms, max {ms[-1]:.1f} ms"


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory(prefix="reelbatch-served-") as tmp:
        cwd = Path(tmp)
        env = embedded_env(cwd / "cache")
        for key in ("REELBATCH_DATABASE_URL", "REELBATCH_BROKER_URL"):
            if key in os.environ:
                env[key] = os.environ[key]
        svc = Service(cwd, env)
        try:
            a, b = svc.client(svc.team("ads")), svc.client(svc.team("clips"))
            assert b.post("/v1/runs", content=SMALL, headers={"content-type": "application/yaml"}).status_code == 201
            body = "".join(json.dumps({"id": f"v{i}", "prompt": f"served video {i}", "steps": 2,
                                       "resolution": "64x64", "duration_s": 0.5}) + "\n" for i in range(count))

            def poll(until: threading.Event, into: list[float]) -> None:
                while not until.is_set():
                    for path in ("/v1/runs", "/v1/runs/small"):
                        started = time.perf_counter()
                        assert b.get(path).status_code == 200
                        into.append(time.perf_counter() - started)

            idle: list[float] = []
            stop = threading.Event()
            timer = threading.Timer(3.0, stop.set)
            timer.start()
            poll(stop, idle)
            during: list[float] = []
            stop = threading.Event()
            poller = threading.Thread(target=poll, args=(stop, during))
            poller.start()
            started = time.perf_counter()
            answer = a.post("/v1/runs?name=big&model=tiny", content=body,
                            headers={"content-type": "application/jsonl"}, timeout=600)
            submit_s = time.perf_counter() - started
            stop.set()
            poller.join()
            print(f"A's submit of {count:,} videos ({len(body) / 1e6:.1f} MB): {answer.status_code} in {submit_s:.1f} s"
                  f" -> {answer.text[:200]}")
            print(f"B idle:   {summary(idle)}")
            print(f"B during: {summary(during)}")
            status = a.get("/v1/runs/big")
            print(f"A's status after: {status.status_code} {status.text[:300]}")
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
