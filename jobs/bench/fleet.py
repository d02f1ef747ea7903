"""`reelbatch bench fleet`: how many GPUs one PostgreSQL and one Redis serve, measured with simulated workers.

Each level is a scratch database and queue (jobs.bench.scratch) holding two runs, one per simulated model, and
`workers` simulated workers (jobs.bench.fleet_sim: the real claim, lease, record, ledger, sweeper and ticket code
around a stand-in engine) in PROCESSES processes. A third of the workers serve sim-a, a third sim-b, a third both,
and each model's videos are in proportion to the workers serving it.
Time is compressed by `factor`, so a level of N simulated workers offers the control plane the load of N / factor
GPUs rendering `batch_s`-second batches. Each worker renders about `batches` batches; the level ends when every video
is done.

Per level: cycles per second (claimed, rendered and recorded batches) and the claim's latency (P50/P95/P99, as the
client sees it), both sustained (Steady: while every worker is at work; what the verdict judges) and over the level's
span (first claim to last record), the database's time per video (PostgreSQL's own
active time in the level's database, and its transactions), the fleet the rate supports (cycles per second x
`batch_s`: each GPU needs one cycle per batch), and, from the rows, duplicates (a video charged twice), lost videos
(not succeeded) and wasted attempts (a unit claimed more than once). The servers' own counters are read by
jobs.bench.fleet_stats.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import func, select

from jobs.bench.fleet_sim import MODELS, SimPlan, run_process, sim_registry
from jobs.bench.fleet_stats import backend_cpu, pg_stats, redis_cpu, server_statements, shown, track_statements
from jobs.bench.scratch import drop_queues, require_services, scratch_database, scratch_queue
from jobs.db import submission
from jobs.db.connect import session_factory
from jobs.db.rows import CostRecord, Video
from jobs.db.status import Status
from jobs.manifest import load_manifest
from jobs.reports.stats import percentiles, span_s
from jobs.settings import Settings
from jobs.work.app import create_app
from jobs.work.tickets import send_tickets

LEVELS = (10, 20, 40, 80)
FACTOR = 0.02  # 1 simulated worker = 50 GPUs; a 60 s batch takes 1.2 s, the 120 s lease 2.4 s
BATCH_S = 60.0
BATCHES = 12  # per simulated worker, about
PROCESSES = 4  # simulated workers are threads in this many processes (each its own interpreter and GIL)
POOL_PER_PROCESS = 20  # PostgreSQL connections per process: 80 in all, under the default max_connections of 100
# What a level must show to count as supported (the targets): claim P99 and keeping up with the offered load.
CLAIM_P99_MS = 100.0
KEEPS_UP = 0.9


@dataclass
class FleetLevel:
    workers: int  # simulated workers
    gpus: float  # the GPUs they stand for: workers / factor
    videos: int
    batches: int
    span_s: float
    cycles_per_s: float  # over the whole span (first claim to last record), its start and its drain included
    offered_cycles_per_s: float  # if the control plane took no time: workers / (batch_s x factor)
    claim_ms: dict[str, float]  # every claim of the level
    # Sustained: the middle of the level (Steady), where every worker is at work; what supports_gpus and ok judge.
    steady_s: float
    steady_cycles_per_s: float
    steady_claim_ms: dict[str, float]
    db_active_ms_per_video: float  # PostgreSQL's active time in the level's database (lock waits included)
    db_cpu_ms_per_video: float | None  # its backends' CPU time, where the server runs on this machine
    transactions_per_video: float
    statements_per_video: float  # as the simulated workers sent them
    supports_gpus: float  # steady_cycles_per_s x batch_s
    duplicates: int  # videos charged for more than one successful render
    lost: int  # videos neither succeeded nor failed when the level ended
    failed: int  # videos failed: their leases expired on every attempt (a simulated worker starved of CPU)
    wasted_attempts: int  # claims beyond each video's first
    worker_cpu_s: float  # the simulated workers' processes, from their workers' start (not their imports)
    redis_cpu_s: float
    # The statements sent most, per video, as the client timed them: what the database spends its time on.
    statements: list[dict]
    # PostgreSQL's own time per statement (pg_stat_statements, where the server loads it), the most first.
    server_statements: list[dict] | None

    @property
    def keeps_up(self) -> float:
        """Sustained cycles over offered ones."""
        return self.steady_cycles_per_s / self.offered_cycles_per_s if self.offered_cycles_per_s else 0.0

    @property
    def ok(self) -> bool:
        return (self.keeps_up >= KEEPS_UP and self.steady_claim_ms["p99"] < CLAIM_P99_MS and not self.duplicates
                and not self.lost and not self.failed)

    def to_dict(self) -> dict:
        return {**asdict(self), "keeps_up": self.keeps_up, "ok": self.ok}


@dataclass
class FleetBench:
    batch_s: float
    factor: float
    max_batch: int
    processes: int
    connections: int
    levels: list[FleetLevel]

    def supported_gpus(self) -> float:
        """The largest fleet a level served within the targets (0 if none did)."""
        return max((lv.gpus for lv in self.levels if lv.ok), default=0.0)

    def to_dict(self) -> dict:
        return {"batch_s": self.batch_s, "factor": self.factor, "max_batch": self.max_batch,
                "processes": self.processes, "connections": self.connections,
                "levels": [lv.to_dict() for lv in self.levels], "supported_gpus": self.supported_gpus()}


def run_fleet(settings: Settings, *, levels: tuple[int, ...] = LEVELS, factor: float = FACTOR,
              batch_s: float = BATCH_S, batches: int = BATCHES, processes: int = PROCESSES,
              on_level: Callable[[int], None] | None = None) -> FleetBench:
    require_services(settings, "bench fleet")
    out = []
    for workers in levels:
        if on_level:
            on_level(workers)
        out.append(_level(settings, workers, factor, batch_s, batches, processes))
    return FleetBench(batch_s, factor, settings.worker.max_batch, processes, processes * POOL_PER_PROCESS, out)


def _serves(i: int) -> tuple[str, ...]:
    return (MODELS[0],) if i % 3 == 0 else (MODELS[1],) if i % 3 == 1 else MODELS


def videos_per_model(workers: int, total: int) -> dict[str, int]:
    """`total` videos split between the models as the workers serve them (a worker serving both counts half for
    each), so each model's work lasts about as long: 10 workers are 4 for sim-a, 3 for sim-b and 3 for both, so
    sim-a gets 5.5 tenths. Split evenly, sim-a's work ran out at 11 s of 19, and its 4 workers idled to the end."""
    shares = {model: sum(1 / len(_serves(i)) for i in range(workers) if model in _serves(i)) for model in MODELS}
    return {model: math.ceil(total * share / workers) for model, share in shares.items()}


def _level(settings: Settings, workers: int, factor: float, batch_s: float, batches: int,
           processes: int) -> FleetLevel:
    per_model = videos_per_model(workers, workers * batches * settings.worker.max_batch)
    queue = scratch_queue("fleet")
    with tempfile.TemporaryDirectory(prefix="reelbatch-fleet-") as tmp, \
            scratch_database(settings.database_url, "reelbatch_fleet") as url:
        level = settings.with_values({"database_url": url, "worker.queue": queue,
                                      "manifest.default_output": Path(tmp).as_uri() + "/", "worker.metrics_port": None})
        factory = session_factory(url)
        app = create_app(level)
        for model, count in per_model.items():
            manifest = Path(tmp) / f"{model}.jsonl"
            manifest.write_text("".join(json.dumps({"id": f"v{i}", "prompt": f"{model} video {i}"}) + "\n"
                                        for i in range(count)))
            spec = load_manifest(manifest, registry=sim_registry(), name=f"fleet-{model}", model=model,
                                 output=level.manifest.default_output)
            submitted = submission.submit_run(factory, spec, output=level.manifest.default_output)
            send_tickets(app, submitted.pending_units, model)
        before, redis_before = pg_stats(url), redis_cpu(settings.broker_url)
        tracked = track_statements(url)
        results = _simulate(level, workers, factor, batch_s, processes, factory, sum(per_model.values()))
        time.sleep(1.0)  # PostgreSQL flushes a backend's statistics at most once a second
        after, redis_after = pg_stats(url), redis_cpu(settings.broker_url)
        level_row = _from_rows(factory, workers, factor, batch_s, results, before, after,
                               redis_after - redis_before, server_statements(url) if tracked else None)
        factory.kw["bind"].dispose()  # its database is about to be dropped
        session_factory.cache_clear()
        drop_queues(settings.broker_url, queue)
    return level_row


def _simulate(level: Settings, workers: int, factor: float, batch_s: float, processes: int, factory,
              videos: int) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    count = min(processes, workers)
    share = [list(range(i, workers, count)) for i in range(count)]
    procs = [context.Process(target=run_process, daemon=True, args=(
        SimPlan(level, tuple(_serves(i) for i in mine), tuple(mine), batch_s, factor,
                min(POOL_PER_PROCESS, 3 * len(mine))), stop, results)) for mine in share]
    for proc in procs:
        proc.start()
    # Ideal length: `videos` / (workers x max_batch) batches each; allow five times that, and a minute to start.
    deadline = time.monotonic() + 60 + 5 * videos / (workers * level.worker.max_batch) * batch_s * factor
    cpu: dict[int, float] = {}
    while time.monotonic() < deadline and _unfinished(factory):
        backend_cpu(factory, cpu)
        time.sleep(0.5)
    backend_cpu(factory, cpu)
    stop.set()
    out = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    errors = [e for r in out for e in r["errors"]]
    if errors:
        raise RuntimeError(f"a simulated worker failed ({len(errors)} in all):\n{errors[0]}")
    out[0]["backend_cpu_s"] = sum(cpu.values()) if cpu else None
    return out


def _unfinished(factory) -> int:
    with factory() as s:
        return s.scalar(select(func.count()).select_from(Video).where(Video.status.in_([Status.PENDING,
                                                                                        Status.RUNNING])))


@dataclass(frozen=True)
class Steady:
    """The sustained part of a level: while every simulated worker was at work, from the last one's first claim to
    the first one's last. Before it the workers are still starting (processes, sessions, consumers: seconds on two
    cores while the first ones already claim); after it some worker's models have no work left (a third of the
    workers serve one model only, and one model's work ends before the other's), so it idles. A fleet rendering all
    night is in the middle, so the verdict is taken there."""

    seconds: float
    cycles_per_s: float  # claims that took work (each starts a cycle) inside it, a second
    claim_s: list[float]  # those claims' seconds

    @classmethod
    def of(cls, claims: list[tuple[str, float, float]]) -> Steady:
        """`claims`: (worker, when it ended, its seconds) for each claim that took work. The claims ending after the
        window's start, up to and with its end, count."""
        ends: dict[str, list[float]] = {}
        for worker, at, _ in claims:
            ends.setdefault(worker, []).append(at)
        lo = max((min(at) for at in ends.values()), default=0.0)
        hi = min((max(at) for at in ends.values()), default=0.0)
        if hi <= lo:
            return cls(0.0, 0.0, [])
        inside = [seconds for _, at, seconds in claims if lo < at <= hi]
        return cls(hi - lo, len(inside) / (hi - lo), inside)


def _from_rows(factory, workers: int, factor: float, batch_s: float, results: list[dict], before, after,
               redis_cpu_s: float, server_statements: list[dict] | None) -> FleetLevel:
    with factory() as s:
        rows = s.execute(select(Video.status, Video.started_at, Video.finished_at, Video.attempts)).all()
        charged = dict(s.execute(select(CostRecord.video_id, func.count()).where(CostRecord.kind == "gpu")
                                 .group_by(CostRecord.video_id)).all())
    done = [r for r in rows if Status(r.status) is Status.SUCCEEDED]
    span = span_s((r.started_at for r in done), (r.finished_at for r in done))
    batches = sum(r["batches"] for r in results)
    claims = [claim for r in results for claim in r["claims"]]
    videos = max(len(done), 1)
    cycles = batches / span if span else 0.0
    steady = Steady.of(claims)
    no_claims = dict.fromkeys(("p50", "p95", "p99", "max"), 0.0)
    return FleetLevel(
        workers=workers, gpus=workers / factor, videos=len(rows), batches=batches, span_s=span, cycles_per_s=cycles,
        offered_cycles_per_s=workers / (batch_s * factor),
        claim_ms=percentiles([s * 1000 for _, _, s in claims]) or no_claims,
        steady_s=steady.seconds, steady_cycles_per_s=steady.cycles_per_s,
        steady_claim_ms=percentiles([s * 1000 for s in steady.claim_s]) or no_claims,
        db_active_ms_per_video=(after[0] - before[0]) / videos,
        db_cpu_ms_per_video=(None if results[0].get("backend_cpu_s") is None
                             else results[0]["backend_cpu_s"] * 1000 / videos),
        transactions_per_video=(after[1] - before[1]) / videos,
        statements_per_video=sum(r["statements"] for r in results) / videos,
        supports_gpus=steady.cycles_per_s * batch_s,
        duplicates=sum(1 for n in charged.values() if n > 1),
        lost=sum(1 for r in rows if not Status(r.status).terminal),
        failed=sum(1 for r in rows if Status(r.status) is Status.FAILED),
        wasted_attempts=sum(max(0, r.attempts - 1) for r in rows),
        worker_cpu_s=sum(r["cpu_s"] for r in results), redis_cpu_s=redis_cpu_s,
        statements=_top_kinds(results, videos), server_statements=server_statements,
    )


def _top_kinds(results: list[dict], videos: int, top: int = 8) -> list[dict]:
    kinds: dict[str, list] = {}
    for r in results:
        for kind, (count, seconds) in r["kinds"].items():
            entry = kinds.setdefault(kind, [0, 0.0])
            entry[0] += count
            entry[1] += seconds
    ranked = sorted(kinds.items(), key=lambda item: -item[1][0])[:top]
    return [{"statement": shown(kind), "per_video": count / videos, "client_ms": seconds * 1000}
            for kind, (count, seconds) in ranked]
