"""The cost ledger closes: every second of a worker session is charged to a video or counted idle, to the cent.

The main test drives the real path (claim -> tiny engine -> PyAV -> store -> rows) on a controlled clock: renders,
encodes and idle gaps take exactly the seconds the test says, so each charge and the idle time are known in advance.
"""

from datetime import timedelta

import pytest
from sqlalchemy import select

from engine.engine import Engine
from jobs.cost import ledger
from jobs.cost.meter import Meter
from jobs.db import queries, submission
from jobs.db.base import utcnow
from jobs.db.connect import session_factory
from jobs.db.rows import CostRecord, Video, WorkerSession, WorkUnit
from jobs.manifest import load_manifest
from jobs.render.batch import Finisher, render_next_batch
from jobs.render.stopping import Stopping
from jobs.reports.summary import report_dict
from jobs.settings import Settings
from storage.stores import StoreUnavailable
from tests.jobs.clocked import RATE, Clock, clock_the_encoder

RENDER_S, ENCODE_S = 60.0, 5.0


@pytest.fixture
def world(tmp_path, db_url, model_cache, registry, monkeypatch):
    """On both databases (tests/jobs/conftest.py): PostgreSQL sums money as NUMERIC, SQLite as integers."""
    settings = Settings.from_env({}).with_values({"database_url": db_url, "engine.cache_dir": model_cache,
                                                  "worker.max_batch": 2, "prices.gpu.usd_per_hour": RATE.usd_per_hour,
                                                  "prices.gpu.source": RATE.source, "limits.retry_backoff_s": 0.0,
                                                  # encodes one after another, each ENCODE_S on the clock
                                                  "worker.overlap": False, "worker.store_threads": 1})
    factory = session_factory(settings.database_url)
    clock = Clock()
    engine = Engine(settings.engine_config(), registry)
    real_render = engine.render

    def render(batch, **kwargs):  # a batch's render takes RENDER_S on the worker's clock, whatever its size
        rendered = real_render(batch, **kwargs)
        clock.advance(RENDER_S)
        return rendered

    monkeypatch.setattr(engine, "render", render)
    clock_the_encoder(monkeypatch, clock, ENCODE_S)

    def submit(name: str, videos: int, steps: int = 1):
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(f"name: {name}\ndefaults: {{steps: {steps}}}\nvideos:\n"
                            + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(videos)))
        return submission.submit_run(factory, load_manifest(manifest, registry=registry),
                                  output=f"file://{tmp_path / 'out'}/").run_id

    return settings, factory, engine, clock, submit


def test_the_ledger_closes_to_the_cent_on_a_controlled_clock(world, monkeypatch):
    settings, factory, engine, clock, submit = world
    meter = Meter(RATE, factory, "test-worker", clock=clock)
    first = submit("a", 5)
    # The store refuses v1's first upload: that attempt (its render share and its encode) is a "retry" charge.
    from jobs.manifest import keys

    real_store_for = keys.store_for
    refused = []

    class FlakyStore:
        def __init__(self, store):
            self.store = store

        def put(self, key, *args, **kwargs):
            if key.endswith("/v1.mp4") and not refused:
                refused.append(key)
                raise StoreUnavailable("the store is down for this one upload")
            return self.store.put(key, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.store, name)

    monkeypatch.setattr(keys, "store_for", lambda prefix: FlakyStore(real_store_for(prefix)))

    meter.open()
    clock.advance(30)  # loading the model
    for gap in (100.0, 20.0, 0.0):  # run a: 5 videos + 1 retry = three batches of 2
        result = render_next_batch(settings, engine, factory, meter=meter)
        assert result.claimed == 2
        clock.advance(gap)
        meter.heartbeat()
    assert render_next_batch(settings, engine, factory, meter=meter).claimed == 0, "run a is done"
    second = submit("b", 2)
    clock.advance(40)
    assert render_next_batch(settings, engine, factory, meter=meter).succeeded == 2
    clock.advance(10)
    meter.close()
    assert refused, "the flaky upload happened"

    # Every attempt was a batch of 2 on one shape: RENDER_S shared equally, plus its own encode (storing took no
    # clock time beyond that, and nothing overlapped: storing ran inline).
    per_attempt = RENDER_S / 2 + ENCODE_S
    up = 30 + 3 * (RENDER_S + 2 * ENCODE_S) + 100 + 20 + 0 + 40 + (RENDER_S + 2 * ENCODE_S) + 10
    charged = 8 * per_attempt  # 7 successes and 1 retry
    (session,) = ledger.sessions(factory)
    assert session.state == "stopped" and session.owner == "test-worker"
    assert session.up_s == pytest.approx(up) and session.charged_s == pytest.approx(charged)
    assert session.idle_s == pytest.approx(up - charged) == pytest.approx(30 + 100 + 20 + 40 + 10)
    assert session.total_micro_usd == round(up * 1000)
    assert session.charged_micro_usd + session.idle_micro_usd == session.total_micro_usd, "to the micro-dollar"
    assert session.runs == {first: 5, second: 2}

    with factory() as s:
        records = list(s.scalars(select(CostRecord).join(Video).where(CostRecord.kind != "storage")
                                 .order_by(CostRecord.id)))
        keys = {v.id: (v.run_id, v.key) for v in s.scalars(select(Video))}
    by_video = {}
    for r in records:
        assert r.session_id == session.id and r.rate_usd_per_hour == 3.6 and r.rate_source == RATE.source
        assert r.seconds == pytest.approx(per_attempt) and r.amount_micro_usd == round(per_attempt * 1000)
        by_video.setdefault(keys[r.video_id], []).append(r.kind)
    assert by_video.pop((first, "v1")) == ["retry", "gpu"], "the retry is charged to the video that needed it"
    assert sorted(by_video.values()) == [["gpu"]] * 6

    # Idle time up to the session's last work is spread over the successful videos of the runs it served: 5 of run
    # a's, 2 of run b's. The last 10 s (after run b's last video, before the worker stopped) are the ledger's alone.
    idle_micro = session.idle_micro_usd
    assert (session.spread_s, session.spread_micro_usd) == (pytest.approx(30 + 100 + 20 + 40), 190_000)
    for run_id, share in ((first, 5 / 7), (second, 2 / 7)):
        run_ledger = ledger.run_ledger(factory, run_id)
        assert run_ledger["idle_usd"] == pytest.approx(190_000 * share / 1e6)
        assert run_ledger["utilisation"] == pytest.approx(charged / up)
        assert run_ledger["usd_per_charged_s"] == pytest.approx(0.001), "$3.60 an hour, as its records were charged"
        run_row, videos = queries.load_report(factory, str(run_id))
        report = report_dict(run_row, videos, settings.prices.sale, run_ledger)
        cost = report["cost"]
        assert cost["idle_usd"] == pytest.approx(190_000 * share / 1e6)
        assert cost["per_successful_video_usd"] == pytest.approx(
            (cost["total_usd"] + cost["idle_usd"]) / len(videos))
        assert cost["by_kind_usd"]["gpu"] == pytest.approx(len(videos) * per_attempt / 1000)
    # All runs' charges (storage aside, which is no worker time) plus idle: the session's up time x rate.
    assert sum(r.amount_micro_usd for r in records) + idle_micro == round(up * 1000)


def test_overlapped_storing_is_charged_only_where_no_render_covered_it():
    """Batch k stores (background) while batch k+1 renders: the overlap is paid once, by the render."""
    clock = Clock()
    meter = Meter(RATE, clock=clock)
    storing = meter.uncovered()
    store_a = storing.__enter__()  # t=0: batch A starts storing
    clock.advance(1)
    rendering = meter.busy([1, 2])
    render_b = rendering.__enter__()  # t=1: batch B starts rendering
    clock.advance(3)
    storing.__exit__(None, None, None)  # t=4: A stored; 3 of its 4 s were covered by B's render
    clock.advance(6)
    rendering.__exit__(None, None, None)  # t=10
    with meter.uncovered() as store_b:  # t=10..12: B stores with nothing rendering
        clock.advance(2)
    assert (store_a.seconds, render_b.seconds, store_b.seconds) == (1.0, 9.0, 2.0)
    assert store_a.seconds + render_b.seconds + store_b.seconds == clock() - 1000.0, "every second once"


def test_a_lost_session_charges_its_batch_in_flight_to_its_videos(world):
    """A worker killed mid-render: its heartbeat recorded the batch in flight; another worker's sweeper closes the
    session and charges the seconds up to the last heartbeat to those videos (kind "lost")."""
    settings, factory, engine, clock, submit = world
    run_id = submit("k", 2)
    with factory() as s:
        ids = list(s.scalars(select(Video.id).where(Video.run_id == run_id).order_by(Video.id)))
    meter = Meter(RATE, factory, "doomed", clock=clock)
    meter.open()
    clock.advance(10)
    rendering = meter.busy(ids)
    rendering.__enter__()
    clock.advance(8)
    meter.heartbeat()  # its last: then it is killed (no close, no records)
    assert ledger.close_lost_sessions(factory, stale_after_s=15) == 0, "not stale yet"
    later = utcnow() + timedelta(seconds=16)
    assert ledger.close_lost_sessions(factory, stale_after_s=15, now=later) == 1
    assert ledger.close_lost_sessions(factory, stale_after_s=15, now=later) == 0, "closed once"
    (session,) = ledger.sessions(factory)
    assert (session.state, session.up_s, session.charged_s, session.idle_s) == ("lost", 18.0, 8.0, 10.0)
    with factory() as s:
        lost = list(s.scalars(select(CostRecord).order_by(CostRecord.video_id)))
        assert s.get(WorkerSession, session.id).ended_at is not None
    assert [(r.video_id, r.kind, r.seconds, r.amount_micro_usd) for r in lost] == [
        (ids[0], "lost", 4.0, 4000), (ids[1], "lost", 4.0, 4000)]
    # The process was only presumed dead: its next heartbeat opens a new session instead of counting again.
    meter.heartbeat()
    assert [s.state for s in ledger.sessions(factory)] == ["lost", "open"]


def test_with_the_finisher_the_session_still_closes_to_the_cent(world):
    """Real clock, storing overlapped with rendering: whatever overlapped, charged + idle = up x rate."""
    settings, factory, engine, _, submit = world
    settings = settings.with_values({"worker.overlap": True})
    submit("f", 5)
    meter = Meter(RATE, factory, "overlapping")
    meter.open()
    finisher = Finisher()
    while render_next_batch(settings, engine, factory, finisher, meter=meter).claimed:
        pass
    finisher.wait()
    meter.close()
    (session,) = ledger.sessions(factory)
    assert 0 < session.charged_s <= session.up_s and session.runs
    with factory() as s:
        rendered = sum((v.render_s or 0) + (v.encode_s or 0) + (v.upload_s or 0) for v in s.scalars(select(Video)))
    assert session.charged_s <= rendered + 0.5, "overlapped storing is not charged twice"
    assert abs(session.charged_micro_usd + session.idle_micro_usd - session.total_micro_usd) <= 10, "micro-dollars"


@pytest.mark.parametrize("signal_, kind", [("stop now", "interrupted"), ("5 s grace", "preempted"),
                                           ("100 s grace", None)])
def test_a_shutdown_stops_a_batch_at_a_step_charges_its_seconds_and_hands_it_back(world, monkeypatch, signal_,
                                                                                   kind):
    """The worker's shutdown (jobs.render.stopping) reaches the batch in hand through its lease keeper, on a clock
    where each of its 10 steps takes 2 s and the signal lands in the third. Stopped now, or with a 5 s grace that
    cannot cover the 7 steps left (14 s), the batch stops there: the 6 s spent are charged to its two videos by why
    (3 s each), their units go back at once with no attempt counted, and nothing more is claimed. A 100 s grace
    covers the rest: the batch finishes and is recorded as any other. The session closes to the micro-dollar."""
    settings, factory, engine, clock, submit = world
    run_id = submit("s", 2, steps=10)
    stopping = Stopping(clock)
    steps = []

    def render(batch, should_stop):
        def step():
            clock.advance(2.0)
            steps.append(clock())
            if len(steps) == 3:
                {"stop now": stopping.stop_now, "5 s grace": lambda: stopping.finish(grace_s=5),
                 "100 s grace": lambda: stopping.finish(grace_s=100)}[signal_]()
            return should_stop()

        return Engine.render(engine, batch, should_stop=step)

    monkeypatch.setattr(engine, "render", render)
    meter = Meter(RATE, factory, "stopping", clock=clock)
    meter.open()
    clock.advance(10)
    result = render_next_batch(settings, engine, factory, meter=meter, stopping=stopping)
    clock.advance(4)
    assert render_next_batch(settings, engine, factory, meter=meter, stopping=stopping).claimed == 0
    meter.close()

    with factory() as s:
        units = [(u.status.value, u.attempts, u.lease_owner) for u in s.scalars(select(WorkUnit).order_by(WorkUnit.id))]
        charges = sorted((r.kind, r.seconds, r.amount_micro_usd) for r in s.scalars(
            select(CostRecord).join(Video).where(Video.run_id == run_id, CostRecord.kind != "storage")))
    (session,) = ledger.sessions(factory)
    if kind is None:
        assert (result.claimed, result.succeeded, len(steps)) == (2, 2, 10)
        assert units == [("succeeded", 1, None)] * 2
        # 20 s of steps shared by two, plus each one's 5 s encode.
        assert charges == [("gpu", 15.0, 15000)] * 2
        assert (session.up_s, session.charged_s) == (10 + 20 + 2 * ENCODE_S + 4, 30.0)
    else:
        assert (result.claimed, result.released, len(steps)) == (2, 2, 3)
        assert units == [("pending", 0, None)] * 2
        assert charges == [(kind, 3.0, 3000)] * 2
        assert (session.up_s, session.charged_s) == (10 + 6 + 4, 6.0)
    assert session.charged_micro_usd + session.idle_micro_usd == session.total_micro_usd == round(session.up_s * 1000)
    if kind is not None:  # another worker takes the units at once, and renders each once
        monkeypatch.setattr(engine, "render", lambda batch, should_stop: Engine.render(engine, batch))
        assert render_next_batch(settings, engine, factory, meter=Meter(RATE, clock=clock)).succeeded == 2
        with factory() as s:
            kinds = sorted(r.kind for r in s.scalars(select(CostRecord).where(CostRecord.kind != "storage")))
            assert [u.attempts for u in s.scalars(select(WorkUnit))] == [1, 1]
        assert kinds == sorted([kind, kind, "gpu", "gpu"])
