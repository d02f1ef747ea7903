"""`reelbatch beat` end to end: two real beats and a real worker on the embedded default (SQLite database and broker),
a schedule that fires every 2 seconds, and the database read afterwards: one run per fire time, never two.

The worker is prefork with three children: firing tasks from the two beats run in several processes at once, and a
child is free to fire while the demo's two shapes render in the others (a solo worker fires only between batches).
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone

from .conftest import DEMO

WAIT_S = 40
ENOUGH = 3  # firings to wait for; at least 2 must have happened by WAIT_S


def start(cli, name: str, *args: str) -> tuple[subprocess.Popen, str]:
    log = cli.cwd / f"{name}.log"
    with open(log, "wb") as out:
        # A process group of its own, so that a kill also reaches a prefork worker's children.
        proc = subprocess.Popen([sys.executable, "-m", "jobs", *args], cwd=cli.cwd, env=cli.env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, log


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (a beat exits; a worker finishes the tickets in hand), then SIGKILL to the group if that takes long:
    the test does not wait for a render it has no use for."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # also any children left behind
    except ProcessLookupError:
        pass
    proc.wait()


def firings(db) -> list[tuple]:
    """(fire time, ok, run id, errors) of every finished firing."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select fire_time, ok, run_id, errors from schedule_firings "
                            "where ok = 1 or errors is not null order by fire_time").fetchall()
    return [(datetime.fromisoformat(t).replace(tzinfo=timezone.utc), *rest) for t, *rest in rows]


def test_two_beats_and_a_worker_make_one_run_per_fire_time(cli, tmp_path):
    # Added first, so the SQLite database (and its schema) exists before three processes open it.
    cli("schedule", "add", "often", "--manifest", str(DEMO), "--cron", "* * * * * */2")
    procs = []
    try:
        procs.append(start(cli, "beat-1", "beat", "--interval", "1"))
        procs.append(start(cli, "beat-2", "beat", "--interval", "1"))
        procs.append(start(cli, "worker", "worker", "--pool", "prefork", "--concurrency", "3", "--log-format", "json"))
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and len(firings(tmp_path / "reelbatch.db")) < ENOUGH:
            for proc, log in procs:
                assert proc.poll() is None, f"{log.name} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
    finally:
        for proc, _ in procs:
            stop(proc)
    done = firings(tmp_path / "reelbatch.db")
    logs = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for _, log in procs)
    assert len(done) >= 2, f"only {len(done)} firings in {WAIT_S} s\n{logs}"
    for _, log in procs[:2]:
        assert "Sending due task reelbatch-fire-schedules" in log.read_text(), f"{log.name} never sent\n{logs}"
    assert all(ok and errors is None for _, ok, _, errors in done), done
    # The worker logged JSON lines, each batch's with its run and video ids bound.
    records = [json.loads(line) for line in procs[2][1].read_text().splitlines() if line.startswith("{")]
    claims = [r for r in records if r["message"].startswith("claimed")]
    assert claims and all(r["videos"] and r["runs"][0].startswith("often-") and r["level"] == "INFO" for r in claims)
    assert {"ts", "logger", "process"} <= set(claims[0])
    # Each firing has its own run, named after its fire time, and nothing else made a run.
    run_ids = [run_id for _, _, run_id, _ in done]
    assert len(set(run_ids)) == len(run_ids)
    with sqlite3.connect(tmp_path / "reelbatch.db") as conn:
        runs = dict(conn.execute("select id, name from runs").fetchall())
    assert sorted(runs) == sorted(run_ids), (runs, done)
    for fire_time, _, run_id, _ in done:
        assert fire_time.second % 2 == 0
        assert runs[run_id] == f"often-{fire_time:%Y%m%dT%H%M%SZ}"
    assert not list(tmp_path.glob("celerybeat-schedule*")), "the beat keeps its state in memory"
    listed = cli.json("schedule", "list")["schedules"]
    assert [(s["name"], s["last_firing"]["run_name"]) for s in listed] == [("often", runs[run_ids[-1]])]
