"""The simulated workers of `reelbatch bench fleet` (jobs.bench.fleet runs the levels).

A simulated worker is a thread that does what a worker process does between its tickets and the database, with the
real code: it waits for a Celery ticket on its models' Redis queues (kombu, as the worker's consumer does), claims
with jobs.claims.claims.claim_batch (its Serving: models, affinity, the last shape), holds the claim with the real
LeaseKeeper (renewals), records its videos' checksums with the fenced jobs.render.record.mark_all_uploading and the
batch with record_successes (cost records on its session), notices whether its runs finished as the worker does
(jobs.notify.finished.run_finished), passes its ticket on to a model with work waiting, and runs the real Sweeper
(heartbeat and session ledger, lost-session and lease reaping, tickets for idle work).

What is not real: the engine is a stand-in that sleeps the shape's batch seconds and asks whether the batch should
stop as often as a real render does (jobs.render.keeper's cancel check, every CANCEL_CHECK_S, per denoising step);
nothing is encoded or uploaded (the recorded object is a name and a checksum), and the batch is stored after it
renders, not while the next one renders. Time is compressed by `factor`: the batch, the lease, the sweeper's
interval and the cancel check all run `factor` times their real length, so one simulated worker loads the control
plane as 1/factor GPUs do.
"""

from __future__ import annotations

import hashlib
import resource
import threading
import time
import traceback
from dataclasses import dataclass

from kombu import Consumer, Queue
from sqlalchemy import event
from sqlalchemy.orm import sessionmaker

from engine.models.registry import ModelDefaults, ModelInfo, Registry
from jobs.claims import claims, leases
from jobs.cost.meter import Meter
from jobs.db.connect import make_engine
from jobs.notify.finished import run_finished
from jobs.render import record
from jobs.render.keeper import CANCEL_CHECK_S, LeaseKeeper
from jobs.render.record import VideoOutput
from jobs.render.serving import serving
from jobs.settings import Settings
from jobs.work.app import create_app
from jobs.work.sweeper import Sweeper
from jobs.work.tickets import model_queue, send_tickets

# The simulated models: registered (a manifest may name them) but never loaded.
MODELS = ("sim-a", "sim-b")
SIM_DEFAULTS = ModelDefaults(width=64, height=64, fps=8, duration_s=1.0, steps=20, guidance=5.0)
VIDEO_BYTES = 2_000_000  # what each stand-in video is recorded as weighing (its storage charge)
KIND_CHARS = 600  # statements are counted by their text, cut here (the claim's and a renewal's differ before this)


def sim_registry() -> Registry:
    return Registry({m: ModelInfo(name=m, defaults=SIM_DEFAULTS, max_frames=81) for m in MODELS})


@dataclass(frozen=True)
class SimPlan:
    """One process of simulated workers: its i-th worker is the fleet's worker `indexes[i]` and serves the models
    `serves[i]`."""

    settings: Settings  # the level's: scratch database, scratch queue, the real lease and max batch
    serves: tuple[tuple[str, ...], ...]
    indexes: tuple[int, ...]
    batch_s: float
    factor: float
    pool_size: int


class StandIn:
    """The engine, replaced: what the claim needs of it (registry, loaded models, last and warm shapes) and a timed
    render."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.last_shape = None
        self.warm_shapes: tuple = ()  # engine.engine.Engine.warm_shapes: the last shape is all a stand-in has warm

    def loaded(self) -> tuple[str, ...]:
        return () if self.last_shape is None else (self.last_shape.model,)

    def check_gate(self, name: str) -> None:
        """No lever and nothing distilled to gate: every model it serves passes (jobs.render.serving.gated_models)."""

    def render(self, shape, seconds: float, step_s: float, should_stop, cancel_check) -> None:
        self.last_shape = shape
        self.warm_shapes = (shape,)
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, step_s))
            should_stop()  # the keeper's lease-lost and time-limit checks, as after every denoising step
            cancel_check()


class Stats:
    """One process's measurements, sent back to the parent."""

    def __init__(self):
        self.lock = threading.Lock()
        self.claims: list[tuple[str, float, float]] = []  # per claim that took work: (worker, when it ended, seconds)
        self.empty_claims = 0
        self.batches = 0
        self.recorded = 0
        self.tickets = 0
        self.errors: list[str] = []
        self.statements = 0
        self.statement_s = 0.0
        self.kinds: dict[str, list] = {}  # a statement's opening words -> [count, seconds]


def run_process(plan: SimPlan, stop, results) -> None:
    """A process's simulated workers, until `stop` is set; its Stats (as a dict) go to `results`. Its CPU counts
    from here, not from the process's start: the imports that brought this function into a fresh process take 3-4 s
    of CPU each, before the level's first claim, and were a third of the level's figure."""
    start = resource.getrusage(resource.RUSAGE_SELF)
    stats = Stats()
    engine = make_engine(plan.settings.database_url, pool_size=plan.pool_size)
    _time_statements(engine, stats)
    factory = sessionmaker(engine, expire_on_commit=False)
    app = create_app(plan.settings)
    threads = [threading.Thread(target=_worker, args=(plan, index, models, factory, app, stop, stats), daemon=True)
               for index, models in zip(plan.indexes, plan.serves, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    engine.dispose()
    results.put({"claims": stats.claims, "empty_claims": stats.empty_claims, "batches": stats.batches,
                 "recorded": stats.recorded, "tickets": stats.tickets, "errors": stats.errors,
                 "statements": stats.statements, "statement_s": stats.statement_s, "kinds": stats.kinds,
                 "cpu_s": usage.ru_utime + usage.ru_stime - start.ru_utime - start.ru_stime})


def _time_statements(engine, stats: Stats) -> None:
    """Client-side seconds in each statement (network and server included), summed."""
    started = threading.local()

    @event.listens_for(engine, "before_cursor_execute")
    def _before(*_):
        started.t = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(_conn, _cursor, statement, *_):
        spent = time.perf_counter() - started.t
        kind = " ".join(statement.split())[:KIND_CHARS]
        with stats.lock:
            stats.statements += 1
            stats.statement_s += spent
            entry = stats.kinds.setdefault(kind, [0, 0.0])
            entry[0] += 1
            entry[1] += spent


def _worker(plan: SimPlan, index: int, models: tuple[str, ...], factory, app, stop, stats: Stats) -> None:
    f = plan.factor
    real = plan.settings
    # The lease, and so its renewals (a third of it) and the reaper's and lost-session spans, compressed.
    settings = real.with_values({"limits.lease_s": real.limits.lease_s * f, "worker.models": models})
    engine = StandIn(sim_registry())
    meter = Meter(settings.prices.gpu, factory, f"sim:{index}", models=models)
    busy = threading.Event()
    sweeper = Sweeper(settings, factory, busy, lambda n, m: send_tickets(app, n, m), meter, models)
    sweeper.interval = max(1.0, min(15.0, real.limits.lease_s / 4)) * f  # the worker's real interval, compressed
    try:
        meter.open()
        sweeper.start()
        queues = [Queue(real.worker.queue)] + [Queue(model_queue(real.worker.queue, m)) for m in models]
        with app.connection_for_read() as conn:
            tickets: list = []
            with Consumer(conn, queues, callbacks=[lambda _body, message: tickets.append(message)],
                          accept=["json"], prefetch_count=1):
                while not stop.is_set():
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        continue
                    while tickets:
                        message = tickets.pop()
                        busy.set()
                        try:
                            claimed = _cycle(plan, settings, engine, factory, meter, f"sim:{index}", stats)
                        finally:
                            busy.clear()
                        message.ack()
                        last = engine.last_shape.model if engine.last_shape else None
                        if claimed and (model := claims.next_model(factory, models, prefer=last)) is not None:
                            send_tickets(app, 1, model)
                            with stats.lock:
                                stats.tickets += 1
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the level with it
        with stats.lock:
            stats.errors.append(traceback.format_exc())
    finally:
        sweeper.stopped.set()
        try:
            meter.close()
        except Exception:  # noqa: BLE001 - the level is over; its session is closed by the parent's checks or not
            pass


def _cycle(plan: SimPlan, settings: Settings, engine: StandIn, factory, meter: Meter, owner: str,
           stats: Stats) -> int:
    """One ticket: claim a batch, hold it while the stand-in renders, record each video. Returns how many units."""
    t0 = time.perf_counter()
    claim = claims.claim_batch(factory, owner=owner, max_batch=settings.worker.max_batch,
                               lease_s=settings.limits.lease_s,                                serving=serving(settings, engine))
    spent = time.perf_counter() - t0
    with stats.lock:
        if claim is None:
            stats.empty_claims += 1
        else:
            stats.claims.append((owner, time.time(), spent))
    if claim is None:
        return 0
    seconds, f = plan.batch_s * plan.factor, plan.factor
    run_ids = {u.run_id for u in claim.units}
    with LeaseKeeper(factory, claim, settings.limits.lease_s, time.monotonic() + 10 * seconds + 60) as keeper:
        with meter.busy(u.video_id for u in claim.units) as span:
            engine.render(claim.batch.shape, seconds, CANCEL_CHECK_S * f, keeper.should_stop,
                          lambda: leases.cancelled_runs(factory, run_ids))
        share = span.seconds / len(claim.units)
        # As jobs.render.store records a batch: the checksums in one transaction before the uploads, the successes
        # in one after them.
        digests = {unit.unit_id: hashlib.sha256(f"{unit.run_name}/{unit.key}".encode()).hexdigest()
                   for unit in claim.units}
        held = record.mark_all_uploading(factory, [(unit, digests[unit.unit_id]) for unit in claim.units])
        stored = [(unit, VideoOutput(f"sim://{unit.run_name}/{unit.key}.mp4", VIDEO_BYTES, digests[unit.unit_id],
                                     share, 0.0, 0.0, charged=share))
                  for unit in claim.units if unit.unit_id in held]
        recorded = sum(record.record_successes(factory, stored, meter.rate, settings.prices.storage,
                                               meter.session_id).values())
    run_finished(settings, factory, {u.run_name for u in claim.units})
    with stats.lock:
        stats.batches += 1
        stats.recorded += recorded
    return len(claim.units)
