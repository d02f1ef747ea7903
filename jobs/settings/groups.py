"""The settings' groups, one per part of the service they configure. The engine's group is
engine.levers.config.EngineConfig itself, the manifest's is jobs.manifest.policy.ManifestPolicy and the prices are
jobs.cost.prices' own values: each part is handed the value it reads, never a copy made by matching field names."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs.cost.prices import Price, Rate, StoragePrice


@dataclass(frozen=True)
class Webhooks:
    """How run notifications are delivered (jobs.notify)."""

    secret: str | None = field(repr=False)  # the HMAC key deliveries are signed with; never printed
    backoff_s: float  # a failed delivery's first retry waits this long, doubling


@dataclass(frozen=True)
class Worker:
    """What a worker claims and how it serves it (jobs.work, jobs.claims, jobs.render)."""

    queue: str
    models: tuple[str, ...] | None  # the models it serves; None: every registered one
    affinity_s: float
    max_batch: int
    overlap: bool
    fair_share: bool
    store_threads: int  # 0: auto (jobs.render.encoding.store_threads)
    seam_review: float
    metrics_port: int | None
    warm_uri: str | None  # where warm-start bundles are kept (jobs.render.warm_bundles); None: none
    envelope: str  # "use", "measure" or "off" (jobs.render.envelopes)
    warm: bool  # render each waiting shape once (one step) before the first claim (jobs.render.serving.warm_up)
    device_memory_gib: float | None  # the memory its device may use; None: the device's own
    gpus: tuple[int, ...] | None  # a worker of several ranks: its GPUs, one a rank (engine.group); None: the first


@dataclass(frozen=True)
class Limits:
    """Faults and time: leases, retries and the time a batch is allowed (jobs.claims.leases, jobs.render.failures)."""

    lease_s: float
    max_attempts: int
    retry_backoff_s: float
    time_limit_s: float
    min_time_limit_s: float
    max_render_s: float
    visibility_timeout_s: float


@dataclass(frozen=True)
class Prices:
    """What cost records and margins are written at (jobs.cost)."""

    gpu: Rate
    storage: StoragePrice
    sale: Price


@dataclass(frozen=True)
class Reports:
    """How `reelbatch report` reads a run on PostgreSQL (jobs.reports.postgres)."""

    sql: bool
    parallel: bool
