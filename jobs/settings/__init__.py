"""Service settings: one table of environment variables (name, field, type, default, help), read once per process
into a frozen `Settings` and passed in explicitly. A bad value stops the command with one line naming the variable and
the value (exit 2); nothing is silently truncated. docs/SETTINGS.md's table is made from this one (`reelbatch settings
--markdown`), and a test fails when they differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from engine.config import EngineConfig
from engine.errors import ModelNotFound
from engine.models import Registry
from engine.models_file import load_registry
from jobs.cost.prices import Price, Rate, StoragePrice
from jobs.errors import UsageError
from jobs.manifest.policy import ManifestPolicy
from jobs.settings.variables import VARIABLES

__all__ = ["VARIABLES", "Settings", "markdown_table"]


@dataclass(frozen=True)
class Settings:
    """Every setting of the service, one field per variable of VARIABLES."""

    database_url: str
    broker_url: str
    output: str
    allowed_outputs: tuple[str, ...] | None
    allowed_webhooks: tuple[str, ...] | None
    webhook_secret: str | None = field(repr=False)
    webhook_backoff_s: float
    allowed_inputs: tuple[str, ...] | None
    models_file: Path | None
    cache_dir: Path
    queue: str
    worker_models: tuple[str, ...] | None
    max_models: int
    affinity_s: float
    max_batch: int
    device: str
    batched_guidance: bool
    fast_vae_norm: bool
    overlap: bool
    fair_share: bool
    store_threads: int  # 0: auto (jobs.render.encoding.store_threads)
    compile: bool
    attention: str
    text_cache: bool
    offload_text_encoder: bool
    step_cache: float
    guidance_fraction: float
    step_scale: float
    precision: str
    seam_review: float
    lease_s: float
    max_attempts: int
    retry_backoff_s: float
    time_limit_s: float
    min_time_limit_s: float
    max_render_s: float
    visibility_timeout_s: float
    metrics_port: int | None
    gpu_hour_usd: float
    gpu_hour_source: str
    storage_gb_month_usd: float
    retention_months: float
    egress_gb_usd: float
    storage_source: str
    price_per_video_s: float
    price_source: str
    report_sql: bool
    report_parallel: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(**{v.field: v.value(env) for v in VARIABLES})

    def with_options(self, **options: object) -> Settings:
        """These settings with a command's options (given ones only: None means "not given") over them."""
        return replace(self, **{k: v for k, v in options.items() if v is not None})

    def engine_config(self) -> EngineConfig:
        """The engine's config from the fields both share by name (the engine's switches read from the
        environment); the engine's other fields keep their defaults."""
        shared = {f.name for f in fields(EngineConfig)} & {f.name for f in fields(Settings)}
        if self.attention != "native":
            _check_attention(self.attention)
        return EngineConfig(**{name: getattr(self, name) for name in shared})

    def gpu_rate(self) -> Rate:
        return Rate(self.gpu_hour_usd, self.gpu_hour_source)

    def manifest_policy(self) -> ManifestPolicy:
        """What a manifest may name here: the one value every way in hands to load_manifest (jobs.manifest.policy)."""
        return ManifestPolicy(self.allowed_outputs, self.allowed_webhooks, self.allowed_inputs, self.output)

    def storage_price(self) -> StoragePrice:
        return StoragePrice(self.storage_gb_month_usd, self.retention_months, self.egress_gb_usd, self.storage_source)

    def price(self) -> Price:
        return Price(self.price_per_video_s, self.price_source)

    def registry(self) -> Registry:
        """The built-in models plus the operator's models file; a bad file is a usage error naming it."""
        try:
            return load_registry(self.models_file)
        except ModelNotFound as exc:
            raise UsageError(f"REELBATCH_MODELS: {exc}") from None
        except OSError as exc:
            raise UsageError(f"REELBATCH_MODELS: cannot read {self.models_file}: {exc.strerror}") from None

    def served_models(self, registry: Registry | None = None) -> tuple[str, ...]:
        """The models a worker with these settings serves: every registered model, or those of `worker_models`
        (each must be registered)."""
        registry = registry or self.registry()
        if self.worker_models is None:
            return tuple(registry.names())
        unknown = [m for m in self.worker_models if m not in registry]
        if unknown:
            raise UsageError(f"--models / REELBATCH_WORKER_MODELS: {', '.join(map(repr, unknown))} not registered "
                             f"here (registered: {', '.join(registry.names())})")
        return tuple(dict.fromkeys(self.worker_models))


def _check_attention(name: str) -> None:
    """A diffusers attention-backend name; checked only where an engine is configured (diffusers imports torch)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    names = [b.value for b in AttentionBackendName]
    if name not in names:
        raise UsageError(f"environment variable REELBATCH_ATTENTION: {name!r} is not a diffusers attention backend "
                         f"(one of: {', '.join(names)})")


def markdown_table() -> str:
    """docs/SETTINGS.md's table: every variable, what it means and its default."""
    rows = ["| variable | meaning | default |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.help} | {v.shown} |" for v in VARIABLES]
    return "\n".join(rows) + "\n"
