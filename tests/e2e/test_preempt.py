"""Preemption: a worker on a spot instance gets SIGTERM with a short grace in the middle of a batch. It stops at the
next step, hands its units back at once, and exits; another worker renders them, each exactly once, long before the
units' leases could have expired. Production parts (PostgreSQL, Redis, S3), as in tests/e2e/test_faults.py, whose
farm and checks (tests/e2e/farm.py) this reuses.

Leases here are the default two minutes, so work that came back by expiry would show it twice over: later than
the test waits, and with an attempt counted (the reaper counts the expired claim; a hand-back does not).
"""

from __future__ import annotations

import json
import signal

from sqlalchemy import select

from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.status import Status
from storage.encode import probe_mp4

from .farm import RUN, check_exactly_once, make_farm, rendering_holder, wait_done
from .procs import Workers, wait_for

LEASE_S = 120  # REELBATCH_LEASE_S's default


def rendering_its(nth: int, worker) -> bool:
    """Is `worker` rendering its `nth` claim? Its task for that claim has not returned: with overlap, a rendered
    batch is stored after its task returns, its units still running, and a SIGTERM then has no step to stop at."""
    return worker.claims() == nth and worker.mid_render()


def test_sigterm_with_a_short_grace_hands_the_batch_to_another_worker_at_once(tmp_path, cli_env, postgres_url,
                                                                              redis_server, s3_env):
    """The preempted worker is a prefork one (its rendering child learns of the SIGTERM through the parent), and the
    SIGTERM goes to its whole process group, as `systemctl stop` signals every process of a unit."""
    # 100 steps of 33 frames at 192x192 (make_farm's default): a batch of 3 renders for about 3.5 s on a quiet core
    # of this machine, several times the 1 s grace, against the test's polls every 0.1 s (at tiny's 64x64, 9 frames
    # and 100 steps, 0.6 s: it finished within the 1 s grace, and nothing was preempted). 200 steps held the margin
    # twice over and cost twice the CPU in each of the three long batches rendered.
    # The run's first 6 videos are small warm-ups (make_farm's default), the spot worker's claim 2 may be one of
    # them: it is caught on whichever claim of the long shape it renders warm.
    farm = make_farm(tmp_path, cli_env, database_url=postgres_url, broker_url=redis_server, bucket=s3_env,
                     lease_s=LEASE_S)
    with Workers(farm.env, farm.cwd) as workers:
        spot = workers.start("prefork", ("--grace", "1"))
        other = workers.start("solo")
        farm.submit()

        def spot_rendering():  # warm (a batch done: its first loaded the model), on a batch of the long shape
            # Asked of the spot worker alone: the other may be mid-render at the same moment. A batch of the run's
            # small warm-up videos (tests/e2e/farm.py) renders within the grace: nothing would be handed back.
            found = rendering_holder(farm, workers, only=spot)
            return found if found is not None and farm.long(found[1]) else None

        _, held = wait_for("the spot worker rendering a batch", spot_rendering, 180, interval=0.1,
                           diagnose=workers.tails)
        (spot_owner,) = {u.lease_owner for u in held.values()}  # its rendering child
        claimed = spot.claims()
        spot.signal(signal.SIGTERM)
        wait_for("the spot worker to exit", lambda: not spot.alive(), 60, diagnose=spot.tail)
        assert spot.proc.returncode == 0, spot.tail()
        assert spot.claims() == claimed, "claimed after its SIGTERM"
        said = "SIGTERM: taking no new work; each process's batch in hand: finishing it within the 1 s grace if it can"
        assert said in spot.text() and "(preempted): 3 handed back" in spot.text(), spot.tail()
        wait_done(farm, workers, timeout=300)
        assert other.alive(), other.tail()
        check_exactly_once(farm)
        ledger = json.loads(farm.cli("ledger", "--json").stdout)
    with farm.db.connect() as conn:
        attempts = dict(conn.execute(select(WorkUnit.id, WorkUnit.attempts)).all())
        preempted = sorted(conn.scalars(select(CostRecord.video_id).where(CostRecord.kind == "preempted")))
    assert {uid: attempts[uid] for uid in held} == {uid: 1 for uid in held}, "handed back, not expired"
    assert preempted == sorted(u.video_id for u in held.values())
    # The spot worker closed its session on the way out: its seconds, the preempted ones included, are charged to
    # videos or idle, none twice.
    (session,) = [s for s in ledger["sessions"] if s["owner"] == spot_owner]
    assert session["state"] == "stopped" and 0 < session["charged_s"] <= session["up_s"], session


def test_a_preempted_long_video_keeps_its_finished_chunks(tmp_path, cli_env, postgres_url, redis_server, s3_env):
    """A long video (9 s of tiny: 3 chunks) whose worker is preempted while rendering its second chunk: the chunk
    goes back at once, the first is never rendered again, and the next worker finishes the video from its
    checkpoint."""
    farm = make_farm(tmp_path, cli_env, database_url=postgres_url, broker_url=redis_server, bucket=s3_env,
                     lease_s=LEASE_S)
    manifest = farm.cwd / "long.yaml"
    # 160 steps at 192x192: a chunk renders for a second or more (tests/e2e/test_faults.py).
    manifest.write_text(f"name: {RUN}\ndefaults:\n  steps: 160\n  resolution: 192x192\nvideos:\n  - id: long\n"
                        "    prompt: a long one\n"
                        "    duration_s: 9\n")
    farm.cli("submit", str(manifest))

    def chunks() -> dict[int, tuple[str, int]]:
        with farm.db.connect() as conn:
            return {c: (Status(st).value, a) for c, st, a in conn.execute(
                select(WorkUnit.chunk, WorkUnit.status, WorkUnit.attempts).order_by(WorkUnit.chunk))}

    with Workers(farm.env, farm.cwd) as workers:
        spot = workers.start("solo", ("--grace", "0"))
        wait_for("the second chunk rendering", lambda: chunks().get(1, ("",))[0] == "running"
                 and rendering_its(2, spot), 180, interval=0.1, diagnose=workers.tails)
        spot.signal(signal.SIGTERM)
        wait_for("the spot worker to exit", lambda: not spot.alive(), 60, diagnose=spot.tail)
        assert chunks() == {0: ("succeeded", 1), 1: ("pending", 0), 2: ("pending", 0)}, spot.tail()
        workers.start("solo")
        wait_for("the long video to finish", lambda: farm.counts().get("succeeded") == 1, 300,
                 diagnose=lambda: f"chunks {chunks()}\n{workers.tails()}")
    assert chunks() == {0: ("succeeded", 1), 1: ("succeeded", 1), 2: ("succeeded", 1)}
    body = farm.s3.get_object(Bucket=farm.bucket, Key=f"renders/{RUN}/long.mp4")["Body"].read()
    assert probe_mp4(body).frames == 73
    with farm.db.connect() as conn:
        kinds = sorted(conn.scalars(select(CostRecord.kind).join(Video).where(CostRecord.kind != "storage")))
    assert kinds == ["gpu", "gpu", "gpu", "preempted"], "one charge per chunk rendered, one for the stopped one"
