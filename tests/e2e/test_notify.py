"""Hearing back, as a user and an operator see it: real `reelbatch` processes, two Celery workers whose sweepers tick
every second, PostgreSQL and Redis, and a real HTTP receiver on loopback that refuses the first two deliveries."""

import json
import sqlite3
import uuid
from datetime import timedelta

from PIL import Image
from sqlalchemy import select

from jobs.db.base import as_utc, utcnow
from jobs.db.connect import session_factory
from jobs.db.rows import WorkerSession
from tests.webhooks import receiver, signed_by

from .procs import Workers, wait_for

SECRET = "e2e-webhook-secret-0123456789"


def test_two_workers_one_delivery_after_two_refusals(cli, cli_env, tmp_path, postgres_url, redis_server):
    with receiver([503, 503]) as hook:
        env = {**cli_env, "REELBATCH_DATABASE_URL": postgres_url, "REELBATCH_BROKER_URL": redis_server,
               "REELBATCH_QUEUE": f"notify-{uuid.uuid4().hex[:8]}", "REELBATCH_DEVICE": "cpu",
               "REELBATCH_ALLOWED_WEBHOOKS": hook.url, "REELBATCH_WEBHOOK_SECRET": SECRET,
               # Each worker takes one video, so the two finish the run's last videos about together; a 4 s lease
               # makes the sweepers tick every second; the first retry waits 1 s, the second 2 s.
               "REELBATCH_MAX_BATCH": "1", "REELBATCH_LEASE_S": "4", "REELBATCH_WEBHOOK_BACKOFF_S": "1"}
        cli.env = env
        cli("db", "upgrade")
        manifest = tmp_path / "hear.yaml"
        manifest.write_text(f"name: hear\nmodel: tiny\nnotify: {hook.url}reelbatch/runs\ndefaults: {{steps: 2}}\n"
                            "videos:\n  - {id: a, prompt: one}\n  - {id: b, prompt: two}\n")
        submitted = cli.json("submit", str(manifest))
        factory = session_factory(postgres_url)
        with Workers(env, tmp_path) as workers:
            workers.start()
            workers.start()
            wait_for("the delivery to be accepted", lambda: hook.accepted(), timeout=300, diagnose=workers.tails)
            # Both sweepers go on ticking (each tick is a heartbeat of its worker's session); nothing more is sent.
            after = utcnow() + timedelta(seconds=2)
            wait_for("two more sweeps of each worker", lambda: _all_seen_after(factory, after), timeout=60,
                     diagnose=workers.tails)
            owners = {w.pid for w in workers.all}
    assert [r.answered for r in hook.received] == [503, 503, 200]
    assert all(signed_by(SECRET, r) for r in hook.received)
    assert {r.headers["Reelbatch-Delivery"] for r in hook.received} == {json.loads(hook.received[0].body)["delivery"]}
    assert all(r.path == "/reelbatch/runs" for r in hook.received)
    body = json.loads(hook.received[2].body)
    assert body["run"]["id"] == submitted["run_id"] and body["counts"]["succeeded"] == 2
    assert body["cost"]["per_successful_video_usd"] > 0
    assert body["results"]["results_uri"] == (tmp_path / "outputs" / "hear" / "results.jsonl").as_uri()
    shown = cli.json("notifications", "hear")
    (n,) = shown["notifications"]
    assert n["state"] == "delivered" and n["body"] == body
    assert [(a["number"], a["status_code"], a["accepted"]) for a in n["attempts"]] == [
        (1, 503, False), (2, 503, False), (3, 200, True)]
    assert {int(a["sender"].rsplit(":", 1)[1]) for a in n["attempts"]} <= owners, "sent by the workers"
    text = cli("notifications", "hear").stdout
    assert "delivered" in text and "503 Service Unavailable" in text and "200 accepted" in text
    # Posters: beside each MP4, named in the report and the result file.
    report = cli.json("report", "hear")
    for v in report["videos"]:
        poster = tmp_path / "outputs" / "hear" / f"{v['id']}.jpg"
        assert v["poster_uri"] == poster.as_uri() and Image.open(poster).format == "JPEG"


def _all_seen_after(factory, moment) -> bool:
    with factory() as s:
        seen = list(s.scalars(select(WorkerSession.last_seen_at)))
    return len(seen) == 2 and all(as_utc(t) > moment for t in seen)


def test_cancelling_a_waiting_run_notifies_from_the_cancel(cli, cli_env, tmp_path):
    with receiver() as hook:
        cli.env = {**cli_env, "REELBATCH_ALLOWED_WEBHOOKS": hook.url, "REELBATCH_WEBHOOK_SECRET": SECRET}
        manifest = tmp_path / "wait.jsonl"
        manifest.write_text('{"id": "a", "prompt": "one"}\n')
        cli("submit", str(manifest), "--notify", f"{hook.url}x")
        cli("cancel", "wait")
        assert [r.answered for r in hook.received] == [200] and signed_by(SECRET, hook.received[0])
    body = json.loads(hook.received[0].body)
    assert body["run"]["cancelled"] is True and body["counts"]["cancelled"] == 1
    assert (tmp_path / "outputs" / "wait" / "errors.jsonl").read_text().count('"code": "cancelled"') == 1


def test_bad_webhook_and_encoder_input_exits_2_and_writes_nothing(cli, cli_env, tmp_path):
    cli.env = {**cli_env, "REELBATCH_ALLOWED_WEBHOOKS": "https://hooks.example.com/rb/",
               "REELBATCH_WEBHOOK_SECRET": SECRET}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnotify: https://hooks.example.com/other\ncodec: av1\ncrf: 60\n"
                   "videos:\n  - {id: a, prompt: p}\n")
    proc = cli("submit", str(bad), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"{bad}:2: notify: 'https://hooks.example.com/other' is not under an allowed webhook prefix "
        "(https://hooks.example.com/rb/)",
        f"{bad}:3: codec: must be one of h264, h265, got 'av1'",
        f"{bad}:4: crf: must be an integer from 0 to 51, got 60"]
    jsonl = tmp_path / "v.jsonl"
    jsonl.write_text('{"id": "a", "prompt": "p"}\n')
    proc = cli("submit", str(jsonl), "--notify", "http://hooks.example.com/rb/x", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("--notify: 'http://hooks.example.com/rb/x' is not under an allowed "
                                   "webhook prefix (https://hooks.example.com/rb/)")
    cli.env = {k: v for k, v in cli.env.items() if k != "REELBATCH_WEBHOOK_SECRET"}
    proc = cli("submit", str(jsonl), "--notify", "https://hooks.example.com/rb/x", check=False)
    assert proc.returncode == 2 and "REELBATCH_WEBHOOK_SECRET is not set" in proc.stderr
    db = tmp_path / "reelbatch.db"
    if db.exists():
        assert sqlite3.connect(db).execute("select count(*) from runs").fetchone() == (0,)
