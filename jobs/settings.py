"""Service settings, read from the environment in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from engine.config import EngineConfig
from jobs.errors import UsageError

# A public on-demand rate for one H200: AWS EC2 Capacity Blocks listed it at about $5.41 per accelerator-hour
# (2025-2026 price lists; see shared REFERENCES.md "Cost"). Operators set their own rate and source.
DEFAULT_GPU_HOUR_USD = 5.41
DEFAULT_GPU_HOUR_SOURCE = "AWS EC2 Capacity Blocks, H200, per accelerator-hour (public price list, 2025-2026)"
# What a second of generated video sells for, for gross margin: hosted Wan 2.2 A14B is $0.04-0.08 per second by
# resolution (vendor price pages, 2025-2026); the middle of that range.
DEFAULT_PRICE_PER_VIDEO_S = 0.06
# Keeping videos: S3 Standard's first-50-TB price, and internet egress's first tier (AWS public price list,
# us-east-1, 2025-2026). Egress is charged only when set: many renders never leave the bucket.
DEFAULT_STORAGE_GB_MONTH_USD = 0.023
DEFAULT_STORAGE_SOURCE = "AWS S3 Standard, us-east-1, first 50 TB; egress first tier $0.09/GB (public price list)"
DEFAULT_PRICE_SOURCE = "hosted Wan 2.2 A14B, $0.04-0.08 per video-second by resolution (vendor price pages, 2025-2026)"


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
    price_per_video_s: float = DEFAULT_PRICE_PER_VIDEO_S
    price_source: str = DEFAULT_PRICE_SOURCE
    storage_gb_month_usd: float = DEFAULT_STORAGE_GB_MONTH_USD
    retention_months: float = 1.0
    egress_gb_usd: float = 0.0
    storage_source: str = DEFAULT_STORAGE_SOURCE
    # A claim is held this long unless renewed (renewed every third of it while rendering): the longest a killed or
    # frozen worker can hold work before another takes it over.
    lease_s: float = 120.0
    # Attempts before a video is failed with its last error.
    max_attempts: int = 3
    # First retry waits this long; each further retry waits twice as long (capped at 10 minutes).
    retry_backoff_s: float = 10.0
    # Time allowed for a batch of one Wan 480p 81-frame 50-step video; scaled by each batch's work (see
    # jobs.render.batch.batch_time_limit), never below min_time_limit_s. A batch past its limit is abandoned and retried.
    time_limit_s: float = 1800.0
    min_time_limit_s: float = 60.0
    # The hard limit on one task (a prefork child is killed past it): the longest batch a worker may render.
    max_render_s: float = 4 * 3600.0
    # Redis and SQS redeliver an unacked ticket after this long; it must exceed max_render_s (celery#2599).
    visibility_timeout_s: float = 6 * 3600.0
    queue: str = "render"
    device: str = "auto"
    # Engine switches (engine.config.EngineConfig): each optimisation can be turned off to compare.
    text_cache: bool = True
    offload_text_encoder: bool = False
    batched_guidance: bool = True
    fast_vae_norm: bool = True
    compile: bool = False
    attention: str = "native"
    # Lossy accelerators (EngineConfig), each usable only behind a passing quality gate (engine.gates).
    step_cache: float = 0.0
    guidance_fraction: float = 1.0
    step_scale: float = 1.0
    # A long video whose seam score (engine.chunks.seam_score: 1 is seamless) is above this is marked for review.
    seam_review: float = 2.0
    # Serve Prometheus metrics from each rendering process on this port (a prefork child on port + its index + 1).
    metrics_port: int | None = None
    # Encode, store and record batch k on a background thread while batch k+1 renders (jobs.render.batch.Finisher).
    overlap: bool = True

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
            price_per_video_s=_number(env, "REELBATCH_PRICE_PER_VIDEO_S", DEFAULT_PRICE_PER_VIDEO_S),
            price_source=env.get("REELBATCH_PRICE_SOURCE") or DEFAULT_PRICE_SOURCE,
            storage_gb_month_usd=_price(env, "REELBATCH_STORAGE_GB_MONTH_USD", DEFAULT_STORAGE_GB_MONTH_USD),
            retention_months=_price(env, "REELBATCH_RETENTION_MONTHS", 1.0),
            egress_gb_usd=_price(env, "REELBATCH_EGRESS_GB_USD", 0.0),
            storage_source=env.get("REELBATCH_STORAGE_SOURCE") or DEFAULT_STORAGE_SOURCE,
            device=env.get("REELBATCH_DEVICE") or "auto",
            text_cache=_switch(env, "REELBATCH_TEXT_CACHE", True),
            offload_text_encoder=_switch(env, "REELBATCH_OFFLOAD_TEXT_ENCODER", False),
            batched_guidance=_switch(env, "REELBATCH_BATCHED_GUIDANCE", True),
            fast_vae_norm=_switch(env, "REELBATCH_FAST_VAE_NORM", True),
            overlap=_switch(env, "REELBATCH_OVERLAP", True),
            compile=_switch(env, "REELBATCH_COMPILE", False),
            attention=_attention(env.get("REELBATCH_ATTENTION") or "native"),
            step_cache=_fraction(env, "REELBATCH_STEP_CACHE", 0.0, zero_ok=True),
            guidance_fraction=_fraction(env, "REELBATCH_GUIDANCE_FRACTION", 1.0),
            step_scale=_fraction(env, "REELBATCH_STEP_SCALE", 1.0),
            seam_review=_number(env, "REELBATCH_SEAM_REVIEW", 2.0),
            metrics_port=int(_number(env, "REELBATCH_METRICS_PORT", 1)) if env.get("REELBATCH_METRICS_PORT") else None,
            lease_s=_number(env, "REELBATCH_LEASE_S", 120.0),
            max_attempts=int(_number(env, "REELBATCH_MAX_ATTEMPTS", 3)),
            retry_backoff_s=_number(env, "REELBATCH_RETRY_BACKOFF_S", 10.0),
            time_limit_s=_number(env, "REELBATCH_TIME_LIMIT_S", 1800.0),
            min_time_limit_s=_number(env, "REELBATCH_MIN_TIME_LIMIT_S", 60.0),
            max_render_s=_number(env, "REELBATCH_MAX_RENDER_S", 4 * 3600.0),
            visibility_timeout_s=_number(env, "REELBATCH_VISIBILITY_TIMEOUT_S", 6 * 3600.0),
            queue=env.get("REELBATCH_QUEUE") or "render",
        )

    def engine_config(self) -> EngineConfig:
        """The engine's config from the fields both share by name (the engine's switches read from the
        environment); the engine's other fields keep their defaults."""
        shared = {f.name for f in fields(EngineConfig)} & {f.name for f in fields(Settings)}
        return EngineConfig(**{name: getattr(self, name) for name in shared})

    def gpu_rate(self):
        from jobs.cost.ledger import Rate

        return Rate(self.gpu_hour_usd, self.gpu_hour_source)

    def storage_price(self):
        from jobs.work.leases import StoragePrice

        return StoragePrice(self.storage_gb_month_usd, self.retention_months, self.egress_gb_usd, self.storage_source)

    def price(self):
        from jobs.reports.summary import Price

        return Price(self.price_per_video_s, self.price_source)

    def registry(self):
        from engine.errors import ModelNotFound
        from engine.models import load_registry

        try:
            return load_registry(self.models_file)
        except ModelNotFound as exc:
            raise UsageError(f"REELBATCH_MODELS: {exc}") from None
        except OSError as exc:
            raise UsageError(f"REELBATCH_MODELS: cannot read {self.models_file}: {exc.strerror}") from None


def _float(env: dict[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"environment variable {name}: expected a number, got {raw!r}") from None


def _number(env: dict[str, str], name: str, default: float) -> float:
    value = _float(env, name)
    if value is None:
        return default
    if not value > 0 or value == float("inf"):
        raise UsageError(f"environment variable {name}: must be a positive finite number, got {env[name]!r}")
    return value


def _attention(name: str) -> str:
    """A diffusers attention-backend name (checked against diffusers only when it is not the default)."""
    if name == "native":
        return name
    from diffusers.models.attention_dispatch import AttentionBackendName

    names = [b.value for b in AttentionBackendName]
    if name not in names:
        raise UsageError(f"environment variable REELBATCH_ATTENTION: {name!r} is not a diffusers attention backend "
                         f"(one of: {', '.join(names)})")
    return name


def _price(env: dict[str, str], name: str, default: float) -> float:
    """A price or a quantity that may be zero (free storage, no egress), never negative."""
    value = _float(env, name)
    if value is None:
        return default
    if not 0 <= value < float("inf"):
        raise UsageError(f"environment variable {name}: must be zero or a positive finite number, got {env[name]!r}")
    return value


def _fraction(env: dict[str, str], name: str, default: float, zero_ok: bool = False) -> float:
    value = _float(env, name)
    if value is None:
        return default
    if not (0 <= value <= 1 if zero_ok else 0 < value <= 1):
        raise UsageError(f"environment variable {name}: must be in {'[0' if zero_ok else '(0'}, 1], got {env[name]!r}")
    return value


def _switch(env: dict[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no"):
        return False
    raise UsageError(f"environment variable {name}: expected 1/0 (or on/off, true/false), got {env[name]!r}")


def absolute_output(uri: str) -> str:
    """An output prefix that means the same wherever a worker runs: relative folders are made absolute.

    abspath, not resolve(): symlinks stay as written, so the prefix checked against REELBATCH_ALLOWED_OUTPUTS is the
    prefix used.
    """
    if not uri.endswith("/"):
        uri += "/"
    if uri.startswith("file://"):
        return f"file://{os.path.abspath(uri[len('file://'):])}/"
    if "://" not in uri:
        return f"file://{os.path.abspath(uri)}/"
    return uri
