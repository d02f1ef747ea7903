"""Rows, submission, claims, fenced records and probes against SQLite and a real PostgreSQL."""

import threading

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from jobs.claims import claims, leases
from jobs.cost.prices import Rate
from jobs.db import queries, submission
from jobs.db.connect import make_engine, reads, session_factory, snapshots, upgrade
from jobs.db.rows import CostRecord, Run, Video, WorkUnit
from jobs.db.status import IllegalTransition, Status, transition
from jobs.errors import RunNameTaken
from jobs.manifest import load_manifest
from jobs.render import record


def write_manifest(tmp_path, name="night", priority=0, videos=None, extra=""):
    videos = videos or [("a", "a red circle", ""), ("b", "a blue square", "    seed: 5\n")]
    body = "".join(f"  - id: {vid}\n    prompt: {prompt}\n{more}" for vid, prompt, more in videos)
    path = tmp_path / f"{name}-{priority}.yaml"
    path.write_text(f"name: {name}\npriority: {priority}\n{extra}videos:\n{body}", encoding="utf-8")
    return path


def test_submit_records_run_videos_and_units(factory, registry, tmp_path):
    spec = load_manifest(write_manifest(tmp_path), registry=registry)
    s = submission.submit_run(factory, spec, output="file:///tmp/out/")
    assert (s.created, s.videos, s.pending_units) == (True, 2, 2)
    with factory() as session:
        videos = {v.key: v for v in session.scalars(select(Video))}
        units = list(session.scalars(select(WorkUnit)))
    assert videos["b"].seed == 5
    assert videos["a"].seed == 580902535170594075, "a derived seed is recorded (tests/jobs/test_manifest.py)"
    assert {Status(v.status) for v in videos.values()} == {Status.PENDING}
    assert len(units) == 2 and {u.shape_key for u in units} == {"tiny|64x64|f9|s4|g5"}


def test_a_long_videos_units_are_recorded_in_bulk_with_every_default(factory, registry, tmp_path):
    """submit_run writes rows in bulk (COPY on PostgreSQL): each column the ORM would fill is filled."""
    spec = load_manifest(write_manifest(tmp_path, "long", 3, [("l", "a red circle", "    duration_s: 10\n"),
                                                              ("s", "a blue square", "")]), registry=registry)
    submission.submit_run(factory, spec, output="file:///tmp/out/")
    with factory() as session:
        videos = {v.key: v for v in session.scalars(select(Video))}
        units = sorted((u.video_id, u.chunk, u.ready, u.model, u.priority, u.attempts, u.solo, u.lease_token,
                        u.frames, Status(u.status)) for u in session.scalars(select(WorkUnit)))
    long, short = videos["l"], videos["s"]
    # tiny's window is 33 frames (9 latents) sharing 2 latents: 10 s at 8 fps is 81 frames (21 latents), in 3 chunks
    # of 9, 7 and 7 new latents (engine.long.chunks).
    assert (long.chunks, long.frames, short.chunks) == (3, 81, 1)
    assert units == [(long.id, 0, True, "tiny", 3, 0, False, 0, 33, Status.PENDING),
                     (long.id, 1, False, "tiny", 3, 0, False, 0, 33, Status.PENDING),
                     (long.id, 2, False, "tiny", 3, 0, False, 0, 33, Status.PENDING),
                     (short.id, 0, True, "tiny", 3, 0, False, 0, 9, Status.PENDING)]
    assert (long.attempts, long.needs_review, long.started_at) == (0, False, None)
    assert long.created_at is not None and long.updated_at is not None


def test_same_content_is_idempotent_new_run_gets_a_suffix_and_name_clash_is_refused(factory, registry, tmp_path):
    spec = load_manifest(write_manifest(tmp_path), registry=registry)
    first = submission.submit_run(factory, spec, output="file:///tmp/out/")
    again = submission.submit_run(factory, spec, output="file:///tmp/out/")
    assert (again.run_id, again.created) == (first.run_id, False)
    fresh = submission.submit_run(factory, spec, output="file:///tmp/out/", new_run=True)
    assert fresh.created and fresh.name == "night-2" and fresh.run_id != first.run_id
    third = submission.submit_run(factory, spec, output="file:///tmp/out/", new_run=True)
    assert third.name == "night-3"
    other = load_manifest(write_manifest(tmp_path, videos=[("z", "something else", "")]), registry=registry)
    with pytest.raises(RunNameTaken, match="'night' is already used"):
        submission.submit_run(factory, other, output="file:///tmp/out/")
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 3
        assert session.scalar(select(func.count()).select_from(Video)) == 6


def test_claim_takes_one_shape_highest_priority_first(factory, registry, tmp_path):
    low = load_manifest(write_manifest(tmp_path, "low", 1, [(f"l{i}", "low", "") for i in range(3)]),
                        registry=registry)
    high = load_manifest(write_manifest(tmp_path, "high", 7, [(f"h{i}", "high", "    steps: 2\n")
                                                             for i in range(3)]), registry=registry)
    submission.submit_run(factory, low, output="file:///tmp/out/")
    submission.submit_run(factory, high, output="file:///tmp/out/")
    first = claims.claim_batch(factory, owner="w1", max_batch=2, lease_s=60)
    assert first.batch.shape.steps == 2 and [u.key for u in first.units] == ["h0", "h1"]
    second = claims.claim_batch(factory, owner="w1", max_batch=8, lease_s=60)
    assert [u.key for u in second.units] == ["h2"], "a batch holds one shape only"
    third = claims.claim_batch(factory, owner="w1", max_batch=8, lease_s=60)
    assert [u.key for u in third.units] == ["l0", "l1", "l2"] and third.batch.shape.steps == 4
    assert claims.claim_batch(factory, owner="w1", max_batch=8, lease_s=60) is None
    with factory() as session:
        assert {Status(v.status) for v in session.scalars(select(Video))} == {Status.RUNNING}


def test_concurrent_claims_are_disjoint(factory, registry, tmp_path):
    spec = load_manifest(write_manifest(tmp_path, "many", 0, [(f"v{i}", "p", "") for i in range(40)]),
                         registry=registry)
    submission.submit_run(factory, spec, output="file:///tmp/out/")
    taken: list[list[int]] = [[], []]

    def claimer(slot):
        while (claim := claims.claim_batch(factory, owner=f"w{slot}", max_batch=3, lease_s=60)) is not None:
            taken[slot].extend(u.unit_id for u in claim.units)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not set(taken[0]) & set(taken[1])
    assert len(taken[0]) + len(taken[1]) == 40


def test_success_is_fenced_and_records_one_cost_row(factory, registry, tmp_path):
    spec = load_manifest(write_manifest(tmp_path), registry=registry)
    submission.submit_run(factory, spec, output="file:///tmp/out/")
    claim = claims.claim_batch(factory, owner="w1", max_batch=1, lease_s=60)
    unit = claim.units[0]
    out = record.VideoOutput("file:///tmp/out/night/a.mp4", 1234, "ab" * 32, 3.0, 0.5, 0.5)
    rate = Rate(3.6, "test rate")
    stale = claims.ClaimedUnit(**{**unit.__dict__, "token": unit.token - 1})
    assert record.record_success(factory, stale, out, rate) is False, "a stale lease token writes nothing"
    assert record.record_success(factory, unit, out, rate) is True
    assert record.record_success(factory, unit, out, rate) is False, "a finished unit is never written twice"
    with factory() as session:
        video = session.get(Video, unit.video_id)
        costs = list(session.scalars(select(CostRecord)))
    assert Status(video.status) is Status.SUCCEEDED and video.bytes == 1234
    assert len(costs) == 1
    # 4 s at $3.60 per hour = $0.004
    assert costs[0].amount_micro_usd == 4000 and costs[0].rate_source == "test rate"


def test_a_batch_of_successes_is_one_transaction_that_skips_only_a_lost_lease(factory, registry, tmp_path):
    spec = load_manifest(write_manifest(tmp_path), registry=registry)  # two videos, a and b
    submission.submit_run(factory, spec, output="file:///tmp/out/")
    a, b = claims.claim_batch(factory, owner="w1", max_batch=2, lease_s=60).units
    out = record.VideoOutput("file:///tmp/out/night/x.mp4", 1000, "cd" * 32, 1.0, 0.0, 0.0)
    stale_b = claims.ClaimedUnit(**{**b.__dict__, "token": b.token - 1})
    # Given in the other order than their ids: recorded in unit order, reported by unit id.
    done = record.record_successes(factory, [(stale_b, out), (a, out)], Rate(3.6, "test rate"))
    assert done == {a.unit_id: True, b.unit_id: False}
    with factory() as session:
        statuses = {v.key: Status(v.status) for v in session.scalars(select(Video))}
        costs = [(c.video_id, c.amount_micro_usd) for c in session.scalars(select(CostRecord))]
    assert statuses == {"a": Status.SUCCEEDED, "b": Status.RUNNING}
    assert costs == [(a.video_id, 1000)]  # 1 s at $3.60 per hour
    assert record.record_successes(factory, [], Rate(3.6, "test rate")) == {}


def test_a_batch_of_checksums_is_one_transaction_that_skips_only_a_lost_lease(factory, registry, tmp_path):
    spec = load_manifest(write_manifest(tmp_path), registry=registry)  # two videos, a and b
    submission.submit_run(factory, spec, output="file:///tmp/out/")
    a, b = claims.claim_batch(factory, owner="w1", max_batch=2, lease_s=60).units
    stale_a = claims.ClaimedUnit(**{**a.__dict__, "token": a.token - 1})
    assert record.mark_all_uploading(factory, [(b, "bb" * 32), (stale_a, "aa" * 32)]) == {b.unit_id}
    with factory() as session:
        marked = {v.key: v.upload_sha256 for v in session.scalars(select(Video))}
    assert marked == {"a": None, "b": "bb" * 32}, "the stale token wrote nothing; its neighbour's checksum stands"
    assert record.mark_all_uploading(factory, [(a, "ab" * 32)]) == {a.unit_id}
    with factory() as session:
        assert session.get(Video, a.video_id).upload_sha256 == "ab" * 32
    assert record.mark_all_uploading(factory, []) == set()


def test_terminal_success_never_changes():
    class Row:
        id, status = 1, Status.SUCCEEDED

    for new in Status:
        with pytest.raises(IllegalTransition):
            transition(Row(), new)


def test_a_probe_runs_alone_on_postgres_and_its_connection_goes_back_transactional(postgres_url, registry, tmp_path):
    """A probe (jobs.db.connect.reads: a Core connection) sends its one statement without a BEGIN: after it the
    server reports no transaction open. The same pooled connection then serves an ordinary session, inside a
    transaction again."""
    from psycopg.pq import TransactionStatus

    upgrade(postgres_url)
    engine = make_engine(postgres_url, pool_size=1)
    factory = sessionmaker(engine, expire_on_commit=False)
    submission.submit_run(factory, load_manifest(write_manifest(tmp_path), registry=registry), output="file:///tmp/o/")
    with reads(factory)() as c:
        assert c.scalar(select(func.count()).select_from(Video)) == 2
        probe = c.connection.dbapi_connection
        assert probe.info.transaction_status is TransactionStatus.IDLE
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(Video)) == 2
        plain = s.connection().connection.dbapi_connection
        assert plain is probe and plain.info.transaction_status is TransactionStatus.INTRANS
    run_id = queries.find_run(factory, "night").id
    assert (queries.run_finished(factory, "night"), leases.cancelled_runs(factory, {run_id})) == (False, set())
    queries.cancel_run(factory, "night")
    assert (queries.run_finished(factory, "night"), leases.cancelled_runs(factory, {run_id})) == (True, {run_id})
    engine.dispose()


def test_a_probe_on_sqlite_reads_what_a_session_committed(tmp_path, registry):
    factory = session_factory(f"sqlite:///{tmp_path / 'p.db'}")
    submission.submit_run(factory, load_manifest(write_manifest(tmp_path), registry=registry), output="file:///tmp/o/")
    with reads(factory)() as c:
        assert c.scalar(select(func.count()).select_from(Video)) == 2
    assert queries.run_finished(factory, "night") is False


def test_a_reader_on_sqlite_never_waits_for_a_writers_lock(tmp_path, registry):
    """While another connection holds the write lock with a change not yet committed (a large submit does for
    seconds), a snapshot session and a probe read at once what was committed before; a plain session waits for the
    lock (its transaction begins IMMEDIATE) until the writer is done."""
    import sqlite3
    import time

    factory = session_factory(f"sqlite:///{tmp_path / 'w.db'}")
    submission.submit_run(factory, load_manifest(write_manifest(tmp_path), registry=registry), output="file:///tmp/o/")
    writer = sqlite3.connect(tmp_path / "w.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("DELETE FROM work_units")
    writer.execute("DELETE FROM videos")
    plain: list[int] = []

    def read_plainly():
        with factory() as s:
            plain.append(s.scalar(select(func.count()).select_from(Video)))

    waiting = threading.Thread(target=read_plainly, daemon=True)
    try:
        started = time.perf_counter()
        with snapshots(factory)() as s:
            assert s.scalar(select(func.count()).select_from(Video)) == 2
        with reads(factory)() as c:
            assert c.scalar(select(func.count()).select_from(WorkUnit)) == 2
        assert time.perf_counter() - started < 1
        waiting.start()
        waiting.join(timeout=1.5)
        assert waiting.is_alive() and plain == []  # still waiting for the lock
    finally:
        writer.execute("COMMIT")
        writer.close()
    waiting.join(timeout=20)
    assert plain == [0]  # it read after the writer's commit
    assert snapshots(factory) is snapshots(factory)
