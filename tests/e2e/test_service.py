"""A run submitted over HTTP, rendered by a real worker, watched and collected over HTTP: `reelbatch serve` and
`reelbatch worker` as a user runs them, on the embedded default (SQLite, the SQLite broker, a local folder)."""

from __future__ import annotations

import hashlib
import json
import time

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


def test_the_live_page_follows_a_run_in_a_real_browser(tmp_path, model_cache, chromium):
    import shutil
    import sqlite3

    from tests.e2e.browser import Browser
    from tests.e2e.conftest import DEMO

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    pictures = DEMO.parent / "pictures"
    shutil.copy(pictures / "red-square.png", inputs / "pic.png")
    # One video a batch, so the page sees the run advance video by video; a changed image is retried (it may be
    # restored) a second after each attempt, not the default 10.
    svc = Service(tmp_path, embedded_env(model_cache, REELBATCH_ALLOWED_INPUTS=f"file://{inputs}/",
                                         REELBATCH_MAX_BATCH="1", REELBATCH_RETRY_BACKOFF_S="1"))
    browser = Browser(chromium, tmp_path / "chromium")
    try:
        token = svc.team("ads")
        ours = svc.client(token)
        watched = MANIFEST.replace("served", "watched").replace(
            "videos:\n", "videos:\n  - {id: third, prompt: three}\n  - {id: fourth, prompt: four}\n")
        assert ours.post("/v1/runs", content=watched, headers={"content-type": "application/yaml"}).status_code == 201
        # A video whose picture changes after it was submitted: the worker refuses it, and it fails with an error.
        pictured = (f"name: pictured\nmodel: tiny-i2v\ndefaults: {{steps: 2}}\n"
                    f"videos:\n  - {{id: changed, prompt: one, image: file://{inputs / 'pic.png'}}}\n")
        answer = ours.post("/v1/runs", content=pictured, headers={"content-type": "application/yaml"})
        assert answer.status_code == 201, answer.text
        shutil.copy(pictures / "blue-circle.png", inputs / "pic.png")

        browser.open(svc.url + "/")
        browser.js(f"document.getElementById('token').value = {json.dumps(token)}; "
                   "document.getElementById('login').requestSubmit(); true")
        progress = "document.querySelector('[data-run=watched] .progress')?.textContent"
        seen = [browser.until(progress, timeout=30)]
        assert seen[0].startswith("0 of 4 done (0%)")
        with Workers(svc.env, tmp_path) as workers:
            workers.start()
            started = time.monotonic()
            while not seen[-1].startswith("4 of 4 done (100%)"):
                text = browser.until(progress, timeout=10)
                if text != seen[-1]:
                    seen.append(text)
                assert time.monotonic() < started + 300, workers.tails()
                time.sleep(0.3)
            # A video the quality checks flag for review once the page has read its run's last report (what a
            # stitched long video's seam score does): it shows when the page reads that report again, in at most
            # 20 s (REREAD_MS), while the run below ends.
            with sqlite3.connect(tmp_path / "reelbatch.db") as db:
                db.execute("UPDATE videos SET needs_review = 1, seam_score = 0.42 WHERE key = 'second'")
            failed = "document.querySelector('[data-run=pictured] [data-video=changed] .err')?.textContent"
            error = browser.until(failed, timeout=300)
        assert len(seen) >= 3, f"the page showed the run advancing, not only its start and end: {seen}"
        done = [int(t.split(" of ")[0]) for t in seen]
        assert done == sorted(done) and done[0] == 0 and done[-1] == 4
        assert error.startswith("failed: ") and "image" in error
        flagged = "[data-run=watched] [data-video=second]"
        assert "flagged for review (seam score 0.42)" in browser.until(
            f"document.querySelector('{flagged} .flag')?.textContent", timeout=60)
        assert browser.until(f"document.querySelector('{flagged} img')?.naturalWidth", timeout=30) == 64
        assert browser.js(f"document.querySelector('{flagged} img').src").startswith("blob:")
        assert "cost so far $" in browser.js("document.querySelector('[data-run=watched]').textContent")
    finally:
        browser.close()
        log = svc.stop()
    assert token not in log
