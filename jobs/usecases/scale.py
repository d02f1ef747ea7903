"""The scaling signal: how many workers each model's queue wants now (the rule: jobs.cost.scale), which live workers
are busy and which may go, and the same count as one SQL statement for KEDA's PostgreSQL scaler. What
`reelbatch scale` answers; the workers' reelbatch_desired_workers gauge comes from the same rule.

A worker may go when it holds no unexpired lease and rendered nothing at its last heartbeat; a host (a pod) may go
when every live worker session on it may. Between a read and the stop a worker may claim again: it still drains on
SIGTERM (`reelbatch worker`: the batch in hand finishes), so a wrong pick costs a wait, never a batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from jobs.cost.scale import COLD_START_S, DRAIN_HORIZON_S, ModelSignal, cold_start, desired_total, signals
from jobs.db.base import utcnow
from jobs.db.scale_queries import MODEL_NAME, desired_workers_sql, lease_holders, live_sessions
from jobs.errors import UsageError
from jobs.settings import Settings
from jobs.usecases.database import read_factory
from jobs.work.deadlines import LOST_AFTER_LEASES


@dataclass(frozen=True)
class Worker:
    owner: str  # host:pid, as in leases and sessions
    host: str
    session_id: int
    models: str | None
    leases: int  # units it holds an unexpired lease on
    rendering: bool  # at its last heartbeat
    last_seen_at: str

    @property
    def busy(self) -> bool:
        return self.leases > 0 or self.rendering


@dataclass(frozen=True)
class Scale:
    at: str
    horizon_s: float
    cold_start_s: float
    cold_start_source: str  # "--cold-start-s", measured by recent workers, or the default
    desired: int  # summed over `models`
    models: list[ModelSignal]
    workers: list[Worker]  # live sessions
    may_go: list[str]  # hosts whose every live worker is idle

    def to_dict(self) -> dict:
        return {"at": self.at, "horizon_s": self.horizon_s, "cold_start_s": self.cold_start_s,
                "cold_start_source": self.cold_start_source,
                "desired": self.desired, "models": [m.to_dict() for m in self.models],
                "workers": [{**asdict(w), "busy": w.busy} for w in self.workers], "may_go": self.may_go}


def check(horizon_s: float, cold_start_s: float | None, model: str | None) -> None:
    if not horizon_s > 0:
        raise UsageError(f"--horizon-s must be above 0, got {horizon_s}")
    if cold_start_s is not None and not cold_start_s >= 0:
        raise UsageError(f"--cold-start-s must be 0 or more, got {cold_start_s}")
    if model is not None and not MODEL_NAME.fullmatch(model):
        raise UsageError(f"--model: not a model name, got {model!r}")


def scale(settings: Settings, horizon_s: float = DRAIN_HORIZON_S, cold_start_s: float | None = None,
          model: str | None = None, now: datetime | None = None) -> Scale:
    """`cold_start_s`: None takes the recent worker sessions' measured cold start (jobs.cost.scale.cold_start)."""
    check(horizon_s, cold_start_s, model)
    now = now or utcnow()
    factory = read_factory(settings)
    with factory() as s:
        source = "--cold-start-s"
        if cold_start_s is None:
            cold_start_s, source = cold_start(s)
        found = signals(s, now, horizon_s, cold_start_s, model)
        sessions = live_sessions(s, now, LOST_AFTER_LEASES * settings.limits.lease_s)
        held = lease_holders(s, now)
    workers = [Worker(x.owner, x.owner.rsplit(":", 1)[0], x.id, x.models, held.get(x.owner, 0), x.in_flight,
                      x.last_seen_at.isoformat()) for x in sessions]
    if model is not None:  # the workers that serve it (a session that lists none serves every model)
        workers = [w for w in workers if w.models is None or model in w.models.split(",")]
    hosts = dict.fromkeys(w.host for w in workers)
    may_go = [h for h in hosts if not any(w.busy for w in workers if w.host == h)]
    return Scale(now.isoformat(), horizon_s, cold_start_s, source, desired_total(found), found, workers, may_go)


def keda_query(horizon_s: float = DRAIN_HORIZON_S, cold_start_s: float = COLD_START_S, model: str | None = None,
               dialect: str = "postgresql") -> str:
    """The desired count as one statement with these figures written in (`reelbatch scale --sql`)."""
    check(horizon_s, cold_start_s, model)
    return desired_workers_sql(dialect, model, horizon_s, cold_start_s)
