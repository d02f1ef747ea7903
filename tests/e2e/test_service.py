"""A run submitted over HTTP, rendered by a real worker, watched and collected over HTTP: `reelbatch serve` and
`reelbatch worker` as a user runs them, on the embedded default (SQLite, the SQLite broker, a local folder)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

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

        # A run cancelled before any worker starts: it must not look done.
        dropped = MANIFEST.replace("served", "dropped")
        assert ours.post("/v1/runs", content=dropped, headers={"content-type": "application/yaml"}).status_code == 201
        assert ours.post("/v1/runs/dropped/cancel").json() == {"name": "dropped", "cancelled": 2}

        browser.open(svc.url + "/")
        # Count the page's polls in flight (each starts with GET /v1/runs): never two at once.
        browser.js("window.inFlight = 0; window.mostInFlight = 0; const plain = window.fetch; "
                   "window.fetch = async (path, options) => { const poll = path.split('?')[0] === '/v1/runs'; "
                   "if (poll) { window.inFlight++; window.mostInFlight = Math.max(window.mostInFlight, "
                   "window.inFlight); } try { return await plain(path, options); } "
                   "finally { if (poll) window.inFlight--; } }; true")
        browser.js(f"document.getElementById('token').value = {json.dumps(token)}; "
                   "document.getElementById('login').requestSubmit(); true")
        cancelled = "[data-run=dropped]"
        assert browser.until(f"document.querySelector('{cancelled}')?.dataset.state", timeout=30) == "cancelled"
        assert browser.js(f"document.querySelector('{cancelled} .state').textContent") == "cancelled"
        assert browser.js(f"[...document.querySelectorAll('{cancelled} .bar > div')].map(d => d.className)") == [
            "cancelled"], "a cancelled run's bar is all grey, no green"
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
        # A video flagged by its checks (not by a seam score): shown with the check that failed and its value.
        with sqlite3.connect(tmp_path / "reelbatch.db") as db:
            db.execute("""UPDATE videos SET flagged = 1, checks = '{"frozen": {"limit": 0.5, "passed": false, """
                       """"value": 0.889}, "passed": false, "seed": 3}' WHERE key = 'third'""")
        assert browser.until("document.querySelector('[data-run=watched] [data-video=third] .flag')?.textContent",
                             timeout=60) == "flagged for review (frozen 0.889 > 0.5)"
        assert "cost so far $" in browser.js("document.querySelector('[data-run=watched]').textContent")
        assert browser.js("document.querySelector('[data-run=watched]').dataset.state") == "succeeded"
        # The failed video has no poster: a box says so, no image is shown (none broken).
        changed = "[data-run=pictured] [data-video=changed]"
        assert browser.js(f"document.querySelector('{changed} .noposter').textContent") == "no poster"
        assert browser.js(f"document.querySelector('{changed} img').hidden") is True
        assert browser.js("document.querySelector('[data-run=pictured]').dataset.state") == "failed"
        # Every video of a run is reachable from its list, each MP4 answering with the stored bytes.
        browser.js("document.querySelector('[data-run=watched] details.all summary').click(); true")
        listed = "[...document.querySelectorAll('[data-run=watched] details.all .video')]"
        assert browser.until(f"{listed}.length === 4 && {listed}.map(v => v.dataset.video + ' ' + v.dataset.status)",
                             timeout=30) == ["third succeeded", "fourth succeeded", "first succeeded",
                                             "second succeeded"]  # in the manifest's order
        assert browser.js(f"{listed}.filter(v => v.querySelector('a.mp4')).length") == 4
        stored = {r["id"]: r["sha256"] for r in map(json.loads, ours.get(
            "/v1/runs/watched/results.jsonl").text.splitlines())}
        for video in stored:
            got = browser.js(f"mp4('watched', '{video}').then(async b => [b.type, [...new Uint8Array("
                             "await crypto.subtle.digest('SHA-256', await b.arrayBuffer()))].map(x => "
                             "x.toString(16).padStart(2, '0')).join('')])")
            assert got == ["video/mp4", stored[video]], video
        assert browser.js("window.mostInFlight") == 1, "a poll started before the last one ended"
    finally:
        browser.close()
        log = svc.stop()
    assert token not in log


def _bulk(db: Path, run: str, count: int) -> None:
    """`count` more pending videos (each with its unit) in run `run`, copied in SQL from its first one: what
    submitting them would record, in a second rather than half a minute."""
    import sqlite3

    with sqlite3.connect(db) as c:
        (template,) = c.execute("SELECT v.id FROM videos v JOIN runs r ON r.id = v.run_id WHERE r.name = ?",
                                (run,)).fetchone()
        (last,) = c.execute("SELECT max(id) FROM videos").fetchone()
        columns = [r[1] for r in c.execute("PRAGMA table_info(videos)") if r[1] != "id"]
        picked = ["key || '-' || n" if col == "key" else col for col in columns]
        c.execute(f"WITH RECURSIVE n(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n WHERE n < {count}) "
                  f"INSERT INTO videos ({', '.join(columns)}) SELECT {', '.join(picked)} FROM videos, n "
                  f"WHERE videos.id = {template}")
        units = [r[1] for r in c.execute("PRAGMA table_info(work_units)") if r[1] != "id"]
        picked = ["v.id" if col == "video_id" else f"u.{col}" for col in units]
        c.execute(f"INSERT INTO work_units ({', '.join(units)}) SELECT {', '.join(picked)} FROM videos v "
                  f"JOIN work_units u ON u.video_id = {template} WHERE v.id > {last}")


def test_a_team_with_100k_pending_videos_slows_no_other_team(tmp_path, model_cache, chromium):
    """Team A's 100,000 pending videos: team B's list and status stay within 2x of their time without them (the
    median of 21 requests each), and the live page draws A's run in under 2 s."""
    import statistics

    from tests.e2e.browser import Browser

    svc = Service(tmp_path, embedded_env(model_cache))
    browser = Browser(chromium, tmp_path / "chromium")
    try:
        a_token = svc.team("ads")
        a, b = svc.client(a_token), svc.client(svc.team("clips"))
        big, small = MANIFEST.replace("served", "big"), MANIFEST.replace("served", "small")
        assert a.post("/v1/runs", content=big, headers={"content-type": "application/yaml"}).status_code == 201
        assert b.post("/v1/runs", content=small, headers={"content-type": "application/yaml"}).status_code == 201

        def median_ms(path: str) -> float:
            times = []
            for _ in range(21):
                started = time.perf_counter()
                assert b.get(path).status_code == 200
                times.append(1000 * (time.perf_counter() - started))
            return statistics.median(times)

        idle = {path: median_ms(path) for path in ("/v1/runs", "/v1/runs/small")}
        _bulk(tmp_path / "reelbatch.db", "big", 99_998)
        assert a.get("/v1/runs/big").json()["counts"]["pending"] == 100_000
        time.sleep(6)  # the service's read of the whole queue (every 5 s) now holds A's run
        loaded = {path: median_ms(path) for path in idle}
        for path in idle:
            assert loaded[path] < 2 * idle[path], (path, idle, loaded)
        assert b.get("/v1/runs/small").json()["counts"]["pending"] == 2

        browser.open(svc.url + "/")
        started = time.perf_counter()
        browser.js(f"document.getElementById('token').value = {json.dumps(a_token)}; "
                   "document.getElementById('login').requestSubmit(); true")
        drawn = browser.until("document.querySelector('[data-run=big] .progress')?.textContent", timeout=30,
                              interval=0.05)
        elapsed = time.perf_counter() - started
        assert drawn.startswith("0 of 100000 done (0%)")
        assert elapsed < 2.0, f"the page drew a 100,000-video run in {elapsed:.2f} s"
    finally:
        browser.close()
        svc.stop()


def test_a_large_submit_answers_before_its_last_ticket_and_never_holds_up_another_teams_reads(tmp_path, model_cache):
    """A new run's submit answers once the run is recorded and its first 100 tickets are queued; the other 150 of
    its 250 follow (a resume's too). And a writer holding the database's write lock (as a 100,000-video submit does
    for seconds) does not hold up another team's list or status: they read a snapshot instead of waiting out the
    30 s busy timeout."""
    import sqlite3

    from tests.jobs.test_service_api import broker_messages

    svc = Service(tmp_path, embedded_env(model_cache))
    try:
        a, b = svc.client(svc.team("ads")), svc.client(svc.team("clips"))
        assert b.post("/v1/runs", content=MANIFEST, headers={"content-type": "application/yaml"}).status_code == 201
        assert broker_messages(svc) == 2
        many = "".join(json.dumps({"id": f"v{i}", "prompt": f"video {i}", "steps": 2, "resolution": "64x64",
                                   "duration_s": 0.5}) + "\n" for i in range(250))
        answer = a.post("/v1/runs?name=many&model=tiny", content=many, headers={"content-type": "application/jsonl"})
        assert answer.status_code == 201, answer.text
        assert answer.json()["queued"] is True and answer.json()["pending"] == 250
        wait_for("the rest of the tickets", lambda: broker_messages(svc) == 2 + 250, timeout=60, interval=0.2)
        time.sleep(1)
        assert broker_messages(svc) == 252  # and no more
        # A resume of the 250, cancelled, the same way: 100 tickets before the answer, 150 after.
        assert a.post("/v1/runs/many/cancel").json() == {"name": "many", "cancelled": 250}
        assert a.post("/v1/runs/many/resume").json() == {"name": "many", "requeued": 250}
        wait_for("the resume's tickets", lambda: broker_messages(svc) == 252 + 250, timeout=60, interval=0.2)
        time.sleep(1)
        assert broker_messages(svc) == 502

        writer = sqlite3.connect(tmp_path / "reelbatch.db", isolation_level=None, timeout=1)
        writer.execute("BEGIN IMMEDIATE")  # the write lock, held
        writer.execute("UPDATE runs SET priority = priority WHERE name = 'many'")
        try:
            started = time.perf_counter()
            listed = b.get("/v1/runs")
            status = b.get("/v1/runs/served")
            elapsed = time.perf_counter() - started
            assert listed.status_code == 200 and [r["name"] for r in listed.json()["runs"]] == ["served"]
            assert status.status_code == 200 and status.json()["counts"]["pending"] == 2
            assert elapsed < 5, f"another team's reads waited {elapsed:.1f} s for the write lock"
        finally:
            writer.execute("ROLLBACK")
            writer.close()
    finally:
        svc.stop()
