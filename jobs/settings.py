"""Service settings, read from the environment in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from jobs.errors import UsageError

# A public on-demand rate for one H200: AWS EC2 Capacity Blocks listed it at about $5.41 per accelerator-hour
# (2025-2026 price lists; see shared REFERENCES.md "Cost"). Operators set their own rate and source.
DEFAULT_GPU_HOUR_USD = 5.41
DEFAULT_GPU_HOUR_SOURCE = "AWS EC2 Capacity Blocks, H200, per accelerator-hour (public price list, 2025-2026)"


@dataclass(frozen=True)
class Settings:
    database_url: str
    broker_url: str
    output: str
    cache_dir: Path
    models_file: Path | None
    allowed_outputs: tuple[str, ...] | None
    gpu_hour_usd: float
    gpu_hour_source: str
    max_batch: int
    # How long a claim is held before another worker may take the work over.
    lease_s: float = 3600.0
    device: str = "auto"
    queue: str = "render"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        cwd = Path.cwd()
        allowed = env.get("REELBATCH_ALLOWED_OUTPUTS")
        models = env.get("REELBATCH_MODELS")
        return cls(
            # The embedded default: a SQLite file and a SQLite-backed broker in the working folder, no servers.
            database_url=env.get("REELBATCH_DATABASE_URL") or f"sqlite:///{cwd / 'reelbatch.db'}",
            broker_url=env.get("REELBATCH_BROKER_URL") or f"sqla+sqlite:///{cwd / 'reelbatch-broker.db'}",
            output=env.get("REELBATCH_OUTPUT") or "file://./outputs/",
            cache_dir=Path(env.get("REELBATCH_CACHE_DIR") or Path.home() / ".cache" / "reelbatch"),
            models_file=Path(models) if models else None,
            # A comma-separated list of URI prefixes a manifest's `output` must lie under.
            allowed_outputs=tuple(p.strip() for p in allowed.split(",") if p.strip()) if allowed else None,
            gpu_hour_usd=_number(env, "REELBATCH_GPU_HOUR_USD", DEFAULT_GPU_HOUR_USD),
            gpu_hour_source=env.get("REELBATCH_GPU_HOUR_SOURCE") or DEFAULT_GPU_HOUR_SOURCE,
            max_batch=int(_number(env, "REELBATCH_MAX_BATCH", 4)),
            device=env.get("REELBATCH_DEVICE") or "auto",
            lease_s=_number(env, "REELBATCH_LEASE_S", 3600.0),
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(cache_dir=self.cache_dir, device=self.device, max_batch=self.max_batch)

    def registry(self):
        from engine.models import load_registry

        return load_registry(self.models_file)


def _number(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"environment variable {name}: expected a number, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise UsageError(f"environment variable {name}: must be a positive finite number, got {raw!r}")
    return value
