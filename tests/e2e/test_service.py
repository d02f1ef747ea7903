"""A run submitted over HTTP, rendered by a real worker, watched and collected over HTTP: `reelbatch serve` and
`reelbatch worker` as a user runs them, on the embedded default (SQLite, the SQLite broker, a local folder)."""

from __future__ import annotations

import hashlib
import json

from storage.encode import probe_mp4
from tests.e2e.procs import Workers, wait_for
from tests.jobs.service_server import Service, embedded_env

MANIFEST = ("name: served\nmodel: tiny\ndefaults: {steps: 2, resolution: 64x64, duration_s: 0.5}\n"
            "videos:\n  - {id: first, prompt: one}\n  - {id: second, prompt: two}\n")


def test_a_team_submits_watches_and_collects_a_run(tmp_path, model_cache):
    svc = Service(tmp_path, embedded_env(model_cache))
    try:
        ours, theirs = svc.client(svc.team("ads")), svc.client(svc.team("clips"))
        submitted = ours.post("/v1/runs", content=MANIFEST, headers={"content-type": "application/yaml"})
        assert submitted.status_code == 201, submitted.text
        with Workers(svc.env, tmp_path) as workers:
            workers.start()
            wait_for("the run to finish", lambda: ours.get("/v1/runs/served").json()["counts"]["succeeded"] == 2,
                     timeout=300, interval=1, diagnose=workers.tails)
        report = ours.get("/v1/runs/served/report").json()
        assert report["counts"]["succeeded"] == 2 and report["run_id"] == submitted.json()["run_id"]
        results = [json.loads(line) for line in ours.get("/v1/runs/served/results.jsonl").text.splitlines()]
        assert [r["id"] for r in results] == ["first", "second"]
        assert ours.get("/v1/runs/served/errors.jsonl").text == ""
        for r in results:
            mp4 = ours.get(f"/v1/runs/served/videos/{r['id']}.mp4")
            assert mp4.status_code == 200 and mp4.headers["content-type"] == "video/mp4"
            assert hashlib.sha256(mp4.content).hexdigest() == r["sha256"]
            info = probe_mp4(mp4.content)
            assert (info.width, info.height, info.frames) == (64, 64, r["frames"])
            poster = ours.get(f"/v1/runs/served/videos/{r['id']}/poster.jpg")
            assert poster.status_code == 200 and poster.content[:3] == b"\xff\xd8\xff"  # a JPEG
            assert theirs.get(f"/v1/runs/served/videos/{r['id']}.mp4").status_code == 404
            assert theirs.get(f"/v1/runs/served/videos/{r['id']}/poster.jpg").status_code == 404
        assert ours.get("/v1/runs/served/videos/nobody.mp4").status_code == 404
    finally:
        svc.stop()
