"""Stopping `reelbatch run` as a person at a terminal does: the real CLI in a child process with its own process group
(a terminal's foreground job), Ctrl-C sent to that group while a batch renders, on the embedded default (SQLite,
the SQLite broker, a local folder), as a new user runs it.

What is checked from the outside: the line `run` prints; that no unit was claimed after the first Ctrl-C (every
other unit's status, lease token and attempts are as they were); that the first Ctrl-C lets the batch in hand be
recorded and then exits, the second hands it back (pending again, no attempt counted, its seconds charged as
"interrupted") and exits; the exit code; and that running the same command again finishes every video exactly once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.pool import NullPool

from jobs.db.rows import CostRecord, Video, WorkerSession, WorkUnit
from jobs.db.status import Status

from .conftest import Cli
from .procs import wait_for

VIDEOS, MAX_BATCH = 6, 3
# The run's first batch is 3 warm-ups of the same shape but WARMUP_STEPS steps: it loads the model and times a step
# of this shape, so the batch caught is the second, rendered warm. The other 3 are 100 steps of 33 frames (4 s at
# 8 fps, tiny's window) at 192x192: a batch of 3 renders for about 3.5 s on a quiet core of this machine (2-3 min on
# a loaded one), long enough to be signalled twice in the middle of it. At 64x64 and 9 frames (0.4 s) the batch in
# hand was rendered and stored before the Ctrl-C reached `run`, which then had nothing left to stop. With 200 steps
# for all 6 videos (two long batches per test, and a long rerun) the module took over 7 minutes for its first test
# on a loaded machine, and `run` then outlasted the 240 s the test gives the batch in hand.
STEPS, WARMUP, WARMUP_STEPS = 100, 3, 8
RESOLUTION, DURATION_S = "192x192", 4
MESSAGE = re.compile(rf"^Ctrl-C: finishing the batch in hand \((\d+) videos?, step (\d+) of {STEPS}\), about (\d+) s; "
                     r"Ctrl-C again to stop at once; `reelbatch run (\S+)` resumes$", re.M)
# What `run` does after the batch in hand is recorded, which its estimate leaves out: the worker's warm shutdown, then
# the report. 8.7 s after a Ctrl-C that said 9 s here; the margin is for a loaded 2-core machine.
EXIT_MARGIN_S = 30
FIRST_BATCH = re.compile(rf"^Ctrl-C: finishing the batch in hand \((\d+) videos?, step (\d+) of {STEPS}\), about (\d+) "
                         r"s of steps, then its decode and store; Ctrl-C again to stop at once; ", re.M)
SECOND = ("Ctrl-C again: stopping the batch in hand at its next step and handing it back; "
          "`reelbatch run {manifest}` resumes")


class Run:
    """`reelbatch run` in a process group of its own, its output in files the test reads as it goes."""

    def __init__(self, cwd: Path, env: dict, manifest: Path):
        self.cwd, self.stdout, self.stderr = cwd, cwd / "run.out", cwd / "run.err"
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "jobs", "run", str(manifest)], cwd=cwd, env=env,
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.db = create_engine(f"sqlite:///{cwd / 'reelbatch.db'}", poolclass=NullPool)

    def ctrl_c(self) -> float:
        """What a terminal does on Ctrl-C: SIGINT to the foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return time.monotonic()

    def err(self) -> str:
        return self.stderr.read_text(errors="replace").replace("\r", "\n")

    def units(self) -> dict[int, tuple]:
        with self.db.connect() as conn:
            return {u.id: (Status(u.status).value, u.lease_token, u.attempts, u.lease_owner) for u in conn.execute(
                select(WorkUnit.id, WorkUnit.status, WorkUnit.lease_token, WorkUnit.attempts, WorkUnit.lease_owner))}

    def rendering(self):
        """Once the first batch is stored (the model is loaded; its units stay running while the finisher stores
        it beside the next render), the units of the batch rendering now; else None."""
        units = self.units()
        running = {uid: u for uid, u in units.items() if u[0] == "running"}
        return running if running and sum(u[0] == "succeeded" for u in units.values()) >= MAX_BATCH else None

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`reelbatch run` still running after {timeout} s\n{self.err()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def stop_env(cli_env, tmp_path):
    manifest = tmp_path / "six.yaml"
    defaults = f"  steps: {STEPS}\n  resolution: {RESOLUTION}\n  duration_s: {DURATION_S}\n"
    # The warm-ups first: a batch is one shape, and claims go in the manifest's order.
    manifest.write_text(f"name: stop\ndefaults:\n{defaults}videos:\n" + "".join(
        f"  - {{id: v{i}, prompt: stop test video {i}" + (f", steps: {WARMUP_STEPS}" if i < WARMUP else "") + "}\n"
        for i in range(VIDEOS)))
    # The first batch also builds and loads the model: on a busy CPU that can outlast the smallest batch time
    # limit (60 s), and the batch would be retried one video at a time.
    return {**cli_env, "REELBATCH_MAX_BATCH": str(MAX_BATCH), "REELBATCH_MIN_TIME_LIMIT_S": "900"}, manifest


def start_and_catch_a_batch(tmp_path, env, manifest) -> tuple[Run, dict, dict]:
    """`reelbatch run` with its second batch rendering: the run, the units of that batch, and every unit, as they
    were just before the test's Ctrl-C."""
    run = Run(tmp_path, env, manifest)
    held = wait_for("a batch rendering on a warm worker", run.rendering, 240, interval=0.1, diagnose=run.err)
    # Ten steps into it, so the worker has measured its step time (it needs two): the warm-up batch's own text and
    # denoising seconds (each video's share of its batch's; the same shape and batch size, WARMUP_STEPS steps) say
    # how long that is on this machine, however busy.
    with run.db.connect() as conn:
        text_s, denoise_s = conn.execute(select(func.avg(Video.text_s), func.avg(Video.denoise_s))
                                         .where(Video.status == Status.SUCCEEDED)).one()
    time.sleep(MAX_BATCH * (text_s + 10 * denoise_s / WARMUP_STEPS) + 0.5)
    return run, held, run.units()


def worker_pid(held: dict) -> int:
    (owner,) = {u[3] for u in held.values()}
    return int(owner.rsplit(":", 1)[1])


def gone(pid: int) -> bool:
    """Exited (a zombie whose parent was killed counts: nothing may reap it in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def check_rerun_finishes_each_video_once(tmp_path, env, manifest) -> dict:
    report = Cli(tmp_path, env).json("run", str(manifest))
    assert [v["status"] for v in report["videos"]] == ["succeeded"] * VIDEOS
    files = sorted(p.name for p in (tmp_path / "outputs" / "stop").glob("*.mp4"))
    assert files == sorted(f"v{i}.mp4" for i in range(VIDEOS))
    with create_engine(f"sqlite:///{tmp_path / 'reelbatch.db'}", poolclass=NullPool).connect() as conn:
        gpu = dict(conn.execute(select(CostRecord.video_id, func.count()).where(CostRecord.kind == "gpu")
                                .group_by(CostRecord.video_id)).all())
    assert sorted(gpu.values()) == [1] * VIDEOS, f"one gpu charge per video: {gpu}"
    return report


def test_ctrl_c_finishes_the_batch_in_hand_then_exits_and_a_rerun_finishes_the_run(tmp_path, stop_env):
    env, manifest = stop_env
    run, held, before = start_and_catch_a_batch(tmp_path, env, manifest)
    try:
        signalled = run.ctrl_c()
        said = wait_for("run's message", lambda: MESSAGE.search(run.err()), 30, diagnose=run.err)
        code = run.wait(timeout=240)
        exited_s = time.monotonic() - signalled
    finally:
        run.kill()
    videos, step, about, again = said.groups()
    assert int(videos) == len(held) and 2 <= int(step) <= STEPS and int(about) > 0 and again == str(manifest)
    # Within what it said, plus EXIT_MARGIN_S for what follows the batch's record (the worker's exit, the report).
    assert exited_s <= int(about) + EXIT_MARGIN_S, (about, exited_s)
    assert code == 130, run.err()
    after = run.units()
    # The batch in hand was recorded before `run` exited, and nothing else was claimed after the Ctrl-C.
    assert {uid: after[uid][0] for uid in held} == {uid: "succeeded" for uid in held}
    assert {uid: u for uid, u in after.items() if uid not in held} == \
        {uid: u for uid, u in before.items() if uid not in held}
    assert gone(worker_pid(held)), "the embedded worker outlived run"
    done = sum(u[0] == "succeeded" for u in after.values())
    assert f"interrupted: {done} of {VIDEOS} videos done; `reelbatch run {manifest}` resumes" in run.err()
    assert f"{done} succeeded" in run.stdout.read_text(), "the report of what is done so far"
    print(f"first Ctrl-C at step {step}: said about {about} s; run exited {exited_s:.1f} s after it")
    check_rerun_finishes_each_video_once(tmp_path, env, manifest)


def test_ctrl_c_at_the_first_batchs_first_steps_says_its_time_and_exits_within_it(tmp_path, cli_env):
    """The run's first batch, caught at its first steps (no batch recorded yet, the model just loaded): `run` says
    the time its steps need, in seconds, and exits within that plus the margin. The worker's steps file (beside its
    log, in TMPDIR) says when the first step is done."""
    manifest = tmp_path / "three.yaml"
    manifest.write_text(f"name: first\ndefaults:\n  steps: {STEPS}\n  resolution: {RESOLUTION}\n  duration_s: "
                        f"{DURATION_S}\nvideos:\n" + "".join(f"  - {{id: v{i}, prompt: first {i}}}\n"
                                                            for i in range(MAX_BATCH)))
    env = {**cli_env, "REELBATCH_MAX_BATCH": str(MAX_BATCH), "REELBATCH_MIN_TIME_LIMIT_S": "900",
           "TMPDIR": str(tmp_path)}
    run = Run(tmp_path, env, manifest)
    try:
        wait_for("the first batch's first step", lambda: list(tmp_path.glob("reelbatch-worker-*.steps")), 240,
                 interval=0.05, diagnose=run.err)
        signalled = run.ctrl_c()
        said = wait_for("run's message", lambda: FIRST_BATCH.search(run.err()), 30, diagnose=run.err)
        code = run.wait(timeout=240)
        exited_s = time.monotonic() - signalled
    finally:
        run.kill()
    videos, step, about = said.groups()
    assert (int(videos), code) == (MAX_BATCH, 130) and 1 <= int(step) < STEPS and int(about) > 0, run.err()
    assert exited_s <= int(about) + EXIT_MARGIN_S, (about, exited_s)
    assert sum(u[0] == "succeeded" for u in run.units().values()) == MAX_BATCH
    print(f"first batch's Ctrl-C at step {step}: said about {about} s; run exited {exited_s:.1f} s after it")


def test_a_second_ctrl_c_stops_the_batch_at_its_next_step_and_hands_it_back(tmp_path, stop_env):
    env, manifest = stop_env
    run, held, before = start_and_catch_a_batch(tmp_path, env, manifest)
    try:
        run.ctrl_c()
        wait_for("run's first message", lambda: MESSAGE.search(run.err()), 30, diagnose=run.err)
        signalled = run.ctrl_c()
        code = run.wait(timeout=60)
        exited_s = time.monotonic() - signalled
    finally:
        run.kill()
    assert code == 130 and SECOND.format(manifest=manifest) in run.err(), run.err()
    after = run.units()
    # Handed back: pending, unleased, the attempt not counted, the token the one it was claimed with (nobody
    # claimed it since); every other unit as it was.
    assert {uid: after[uid] for uid in held} == {uid: ("pending", u[1], u[2] - 1, None) for uid, u in held.items()}
    assert {uid: u for uid, u in after.items() if uid not in held} == \
        {uid: u for uid, u in before.items() if uid not in held}
    assert gone(worker_pid(held))
    with run.db.connect() as conn:
        unit_videos = dict(conn.execute(select(WorkUnit.id, WorkUnit.video_id)).all())
        charged = {r.video_id: (r.kind, r.seconds) for r in conn.execute(
            select(CostRecord.video_id, CostRecord.kind, CostRecord.seconds).where(CostRecord.kind == "interrupted"))}
        (session,) = conn.execute(select(WorkerSession.end_reason)).all()
    assert sorted(charged) == sorted(unit_videos[uid] for uid in held) and all(s > 0 for _, s in charged.values())
    assert session.end_reason == "stopped"
    (ledger_session,) = Cli(tmp_path, env).json("ledger")["sessions"]
    assert abs(ledger_session["charged_micro_usd"] + ledger_session["idle_micro_usd"]
               - ledger_session["total_micro_usd"]) < 10_000, ledger_session
    print(f"second Ctrl-C: run exited {exited_s:.1f} s after it")
    report = check_rerun_finishes_each_video_once(tmp_path, env, manifest)
    by_id = {v["id"]: v for v in report["videos"]}
    with run.db.connect() as conn:
        keys = dict(conn.execute(select(Video.id, Video.key)).all())
    for video_id in charged:  # rendered once more after the hand-back, as its first counted attempt
        assert by_id[keys[video_id]]["status"] == "succeeded"
    with run.db.connect() as conn:
        attempts = dict(conn.execute(select(WorkUnit.id, WorkUnit.attempts)).all())
    assert all(attempts[uid] == 1 for uid in held), attempts


def test_the_embedded_worker_stops_with_run_even_when_run_is_killed(tmp_path, stop_env):
    """SIGKILL leaves `run` no chance to stop its worker: the worker sees its parent gone and stops at once (at its
    next step, handing its batch back), as after a second Ctrl-C."""
    env, manifest = stop_env
    run, held, before = start_and_catch_a_batch(tmp_path, env, manifest)
    worker = worker_pid(held)
    try:
        run.proc.kill()  # `run` alone: the worker is in a process group of its own
        run.proc.wait()
        wait_for("the worker to stop", lambda: gone(worker), 60, diagnose=run.err)
    finally:
        run.kill()
        if not gone(worker):
            os.kill(worker, signal.SIGKILL)
    after = run.units()
    assert {uid: after[uid] for uid in held} == {uid: ("pending", u[1], u[2] - 1, None) for uid, u in held.items()}
    assert {uid: u for uid, u in after.items() if uid not in held} == \
        {uid: u for uid, u in before.items() if uid not in held}
    with run.db.connect() as conn:
        kinds = list(conn.scalars(select(CostRecord.kind).where(CostRecord.kind == "interrupted")))
    assert kinds == ["interrupted"] * len(held)
