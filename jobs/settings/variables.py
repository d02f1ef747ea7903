"""The table of settings: every REELBATCH_ environment variable, the Settings field it sets, how it is read, its
default and what it means. A new setting is a row here and a field of the group it configures (jobs.settings.groups,
jobs.settings.Settings)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.levers.precision import MODES, check_mode
from jobs.errors import UsageError
from jobs.settings.readers import (
    BadValue,
    count,
    count_or_auto,
    device,
    device_list,
    envelope_mode,
    fraction,
    fraction_or_zero,
    input_prefixes,
    model_names,
    one_or_two,
    output,
    path,
    port,
    positive,
    prefixes,
    price,
    secret,
    switch,
    text,
    webhook_prefixes,
)

# A public on-demand rate for one H200: AWS EC2 Capacity Blocks listed it at about $5.41 per accelerator-hour
# (2025-2026 price lists; see shared REFERENCES.md "Cost"). Operators set their own rate and source.
DEFAULT_GPU_HOUR_SOURCE = "AWS EC2 Capacity Blocks, H200, per accelerator-hour (public price list, 2025-2026)"
# Keeping videos: S3 Standard's first-50-TB price, and internet egress's first tier (AWS public price list,
# us-east-1, 2025-2026). Egress is charged only when set: many renders never leave the bucket.
DEFAULT_STORAGE_SOURCE = "AWS S3 Standard, us-east-1, first 50 TB; egress first tier $0.09/GB (public price list)"
# What a second of generated video sells for, for gross margin: hosted Wan 2.2 A14B is $0.04-0.08 per second by
# resolution (vendor price pages, 2025-2026); the middle of that range.
DEFAULT_PRICE_SOURCE = "hosted Wan 2.2 A14B, $0.04-0.08 per video-second (vendor price pages, 2025-2026)"


@dataclass(frozen=True)
class Variable:
    name: str  # the environment variable
    field: str  # the Settings field it sets, by path: "database_url", "worker.max_batch", "prices.gpu.source"
    read: Callable[[str], object]
    default: object  # a value, or a callable of no arguments (defaults that depend on the working folder)
    shown: str  # the default as the docs show it
    help: str
    secret: bool = False  # never printed: not in errors, not by `reelbatch settings`

    def value(self, env: Mapping[str, str]) -> object:
        raw = env.get(self.name)
        if raw is None or raw.strip() == "":
            return self.default() if callable(self.default) else self.default
        try:
            return self.read(raw)
        except BadValue as exc:
            got = f"a value of {len(raw)} characters" if self.secret else repr(raw)
            raise UsageError(f"environment variable {self.name}: {exc}, got {got}") from None


def precision_mode(raw: str) -> str:
    """engine.levers.precision's modes (the models file's `precision:` takes the same)."""
    try:
        return check_mode(raw.strip())
    except ValueError:
        raise BadValue(f"expected one of {', '.join(MODES)}") from None


V = Variable
VARIABLES: tuple[Variable, ...] = (
    # Where the service's state lives.
    V("REELBATCH_DATABASE_URL", "database_url", text, lambda: f"sqlite:///{Path.cwd() / 'reelbatch.db'}",
      "`sqlite:///./reelbatch.db`", "SQLAlchemy URL: `sqlite:///FILE` or `postgresql+psycopg://USER:PASS@HOST/DB`"),
    V("REELBATCH_BROKER_URL", "broker_url", text, lambda: f"sqla+sqlite:///{Path.cwd() / 'reelbatch-broker.db'}",
      "`sqla+sqlite:///./reelbatch-broker.db`",
      "Celery broker: `redis://HOST:6379/0` in production; the default is kombu's SQLite transport, no server"),
    V("REELBATCH_MODELS", "models_file", path, None, "only the built-in models",
      "path of the models file (docs/MODELS.md)"),
    # What a manifest may name (manifest: jobs.manifest.policy.ManifestPolicy).
    V("REELBATCH_OUTPUT", "manifest.default_output", output, "file://./outputs/", "`file://./outputs/`",
      "where videos go: `file://DIR/` or `s3://BUCKET/PREFIX/` (`AWS_ENDPOINT_URL` points boto3 at an "
      "S3-compatible store; credentials as usual for boto3)"),
    V("REELBATCH_ALLOWED_OUTPUTS", "manifest.allowed_outputs", prefixes, None, "any",
      "comma-separated URI prefixes a manifest's `output` must lie under"),
    V("REELBATCH_ALLOWED_WEBHOOKS", "manifest.allowed_webhooks", webhook_prefixes, None, "none",
      "comma-separated URL prefixes a run's `notify` must lie under (`https://hooks.example.com/reelbatch/`); "
      "plain `http://` only where a prefix says so, e.g. a receiver on loopback (docs/NOTIFICATIONS.md)"),
    V("REELBATCH_ALLOWED_INPUTS", "manifest.allowed_inputs", input_prefixes, None, "none",
      "comma-separated folders (`/dir/`, `file:///dir/`) and `s3://BUCKET/PREFIX/` prefixes a manifest's `image` "
      "may be read from; an image beside the manifest (a relative path inside its folder) needs none"),
    # Run notifications (webhooks: jobs.settings.groups.Webhooks).
    V("REELBATCH_WEBHOOK_SECRET", "webhooks.secret", secret, None, "unset",
      "the key every webhook delivery is signed with (HMAC-SHA256, at least 16 characters); receivers check the "
      "`Reelbatch-Signature` header with it. Never printed", secret=True),
    V("REELBATCH_WEBHOOK_BACKOFF_S", "webhooks.backoff_s", positive, 30.0, "30",
      "a failed webhook delivery's first retry waits this long, doubling per attempt up to an hour, for 24 hours"),
    # The engine (engine: engine.levers.config.EngineConfig).
    V("REELBATCH_CACHE_DIR", "engine.cache_dir", path, lambda: Path.home() / ".cache" / "reelbatch",
      "`~/.cache/reelbatch`",
      "built models, text embeddings, compile caches and quality gates"),
    V("REELBATCH_MAX_MODELS", "engine.max_models", count, 2, "2",
      "pipelines a worker keeps loaded; loading another unloads the least recently used (`reelbatch worker "
      "--max-models`)"),
    V("REELBATCH_DEVICE", "engine.device", device, "auto", "`auto`", "`cpu`, `cuda`, `cuda:1`, `mps` or `auto`"),
    V("REELBATCH_BATCHED_GUIDANCE", "engine.batched_guidance", switch, True, "`1`",
      "`1`/`0`: classifier-free guidance's two passes in one batched transformer call per step; `0` runs "
      "them as two calls, as diffusers' loop does (with `REELBATCH_FAST_VAE_NORM=0` too, exact mode: bit-identical to a plain "
      "`WanPipeline` call)"),
    V("REELBATCH_FAST_VAE_NORM", "engine.fast_vae_norm", switch, True, "`1`",
      "`1`/`0`: the VAE's channel norms as a sum of squares instead of `F.normalize` (the same values to one "
      "float32 ulp; on a CPU the norm kernel was half of a small model's decode)"),
    V("REELBATCH_COMPILE", "engine.compile", switch, False, "`0`",
      "`1`/`0`: `torch.compile` of the transformer's repeated blocks, once per input shape per worker, cached under "
      "`REELBATCH_CACHE_DIR/inductor/`; a worker's first ticket compiles the shapes waiting before it claims"),
    V("REELBATCH_ATTENTION", "engine.attention", text, "native", "`native`",
      "the transformer's attention kernel, a diffusers attention-backend name: `native` is torch's SDPA; "
      "`flash`, `_flash_3`, `sage` where those packages are installed"),
    V("REELBATCH_ULYSSES", "engine.ulysses", count, 1, "`1`",
      "a worker of several ranks on one machine (docs/OPERATIONS.md, one video on several GPUs): how many split each "
      "video's tokens (Ulysses sequence parallelism; must divide the model's attention heads and each video's "
      "latent tokens; `reelbatch worker --ulysses`); exact"),
    V("REELBATCH_RING", "engine.ring", count, 1, "`1`",
      "ranks of a worker that split each video's tokens by Ring attention (times REELBATCH_ULYSSES; `reelbatch "
      "worker --ring`): not bit-exact, so a lever behind the quality gate (`reelbatch bench quality --setting "
      "ring=2`)"),
    V("REELBATCH_CFG_PARALLEL", "engine.cfg_parallel", one_or_two, 1, "`1`",
      "`2`: the guided steps' conditional and unconditional passes on two halves of a worker's ranks (CFG "
      "parallel, `reelbatch worker --cfg-parallel`); the worker has ulysses x this many ranks; exact"),
    V("REELBATCH_TEXT_CACHE", "engine.text_cache", switch, True, "`1`",
      "`1`/`0`: keep text embeddings in memory and under `REELBATCH_CACHE_DIR/text-embeddings/` (exact)"),
    V("REELBATCH_OFFLOAD_TEXT_ENCODER", "engine.offload_text_encoder", switch, False, "`0`",
      "`1`/`0`: with the text cache on and a GPU, the text encoder waits in CPU memory and visits the GPU only for "
      "texts the cache lacks (exact); on an H200 a batch of new prompts spent 6-8 s moving it"),
    V("REELBATCH_STEP_CACHE", "engine.step_cache", fraction_or_zero, 0.0, "`0`",
      "lossy: diffusers' first-block cache threshold; `0` is off. Used only behind a passing quality gate"),
    V("REELBATCH_GUIDANCE_FRACTION", "engine.guidance_fraction", fraction, 1.0, "`1`",
      "lossy: classifier-free guidance on this fraction of the steps (the first ones); gated"),
    V("REELBATCH_STEP_SCALE", "engine.step_scale", fraction, 1.0, "`1`",
      "lossy: render this fraction of each video's requested steps; gated"),
    V("REELBATCH_PRECISION", "engine.precision", precision_mode, "auto", "`auto`",
      "the precision a model renders at where its registration names none (`precision:`, docs/MODELS.md): `auto` "
      "(native: fp32 on a CPU, bf16 on a GPU), `fp32`, `bf16`, `fp16`, `int8-weight`, `int8`, `fp8` (CUDA 8.9+); "
      "below native, lossy: used only behind a passing quality gate for that model and mode; the text encoder's own "
      "precision is per registration only (`text_encoder_precision:`, docs/MODELS.md)"),
    # The worker (worker: jobs.settings.groups.Worker).
    V("REELBATCH_QUEUE", "worker.queue", text, "render", "`render`",
      "the Celery queue render tickets go to and workers consume (`reelbatch worker --queue`); a model's tickets go "
      "to `QUEUE.model.MODEL`, consumed by the workers that serve it"),
    V("REELBATCH_WORKER_MODELS", "worker.models", model_names, None, "every registered model",
      "comma-separated models a worker serves: it claims only their work (`reelbatch worker --models`)"),
    V("REELBATCH_AFFINITY_S", "worker.affinity_s", price, 600.0, "600",
      "seconds of waiting a loaded model's work is worth when a worker picks its next batch (the last batch's "
      "shape: as much again); `0` turns the preference off"),
    V("REELBATCH_MAX_BATCH", "worker.max_batch", count, 4, "4",
      "largest same-shape batch per pipeline call (`reelbatch worker --max-batch`)"),
    V("REELBATCH_OVERLAP", "worker.overlap", switch, True, "`1`",
      "`1`/`0`: a worker encodes, stores and records batch k on a background thread while batch k+1 renders"),
    V("REELBATCH_FAIR_SHARE", "worker.fair_share", switch, True, "`1`",
      "`1`/`0`: a worker's claim keeps teams to their `max_gpus` and `monthly_usd` and shares idle capacity by "
      "their `share` (jobs.claims.fair); `0`: one queue by rank, whatever the team (docs/SERVICE.md)"),
    V("REELBATCH_STORE_THREADS", "worker.store_threads", count_or_auto, 0, "`auto`",
      "videos of a batch encoded and uploaded at once (`1`: one after another; their records are then written in one "
      "transaction); `auto` is 4 on a GPU and 1 on a CPU, where storing on more threads takes the cores the next "
      "batch renders on"),
    V("REELBATCH_SEAM_REVIEW", "worker.seam_review", positive, 2.0, "2",
      "a long video whose seam score is above this is marked `needs_review` in reports"),
    V("REELBATCH_METRICS_PORT", "worker.metrics_port", port, None, "off",
      "serve Prometheus metrics from each rendering process on this port (a prefork child on port + its index + 1)"),
    V("REELBATCH_WARM_URI", "worker.warm_uri", output, None, "off",
      "with `REELBATCH_COMPILE=1`: a folder or bucket (`file://DIR/`, `s3://BUCKET/PREFIX/`) where workers keep each "
      "shape's compiled code and a new worker fetches it before compiling (warm start); only a store the operators "
      "alone write, since a bundle is code the worker runs"),
    V("REELBATCH_WARM", "worker.warm", switch, False, "`0`",
      "`1`: before its first claim a worker renders one step of each shape waiting most (up to 4) at the batch it "
      "will claim, so its first batch meets loaded weights and warm kernels (`reelbatch worker --warm`); with "
      "`REELBATCH_COMPILE=1` this is always done, as the compile"),
    V("REELBATCH_ENVELOPE", "worker.envelope", envelope_mode, "use", "`use`",
      "memory envelopes (docs/OPERATIONS.md): `use`: a worker takes at most the batch its device's measured envelope "
      "allows for each shape; `measure`: as `use`, and a worker measures a served model's envelope at start when "
      "none is kept for its device; `off`: batches by REELBATCH_MAX_BATCH alone (and submit checks none)"),
    V("REELBATCH_GPUS", "worker.gpus", device_list, None, "all",
      "the GPUs a worker of several ranks uses, one a rank (`reelbatch worker --gpus 0,1,2,3`): as many as "
      "REELBATCH_ULYSSES x REELBATCH_CFG_PARALLEL; default: the first that many"),
    V("REELBATCH_DEVICE_MEMORY_GIB", "worker.device_memory_gib", positive, None, "the device's",
      "the memory, in GiB, a worker's device may use for envelopes (a worker given part of a machine); "
      "default: a GPU's total, a CPU's memory or its cgroup's limit"),
    # Faults and time limits (limits: jobs.settings.groups.Limits).
    V("REELBATCH_LEASE_S", "limits.lease_s", positive, 120.0, "120",
      "how long a worker's claim lasts unless renewed (it is renewed while rendering)"),
    V("REELBATCH_MAX_ATTEMPTS", "limits.max_attempts", count, 3, "3",
      "attempts before a video fails with its last error"),
    V("REELBATCH_RETRY_BACKOFF_S", "limits.retry_backoff_s", positive, 10.0, "10",
      "first retry's wait; doubles per retry, capped at 600"),
    V("REELBATCH_TIME_LIMIT_S", "limits.time_limit_s", positive, 1800.0, "1800",
      "time allowed for a batch of one 480p 81-frame 50-step video; scaled by work"),
    V("REELBATCH_MIN_TIME_LIMIT_S", "limits.min_time_limit_s", positive, 60.0, "60", "the least time any batch gets"),
    V("REELBATCH_MAX_RENDER_S", "limits.max_render_s", positive, 4 * 3600.0, "14400",
      "hard limit on one task (prefork pool)"),
    V("REELBATCH_VISIBILITY_TIMEOUT_S", "limits.visibility_timeout_s", positive, 6 * 3600.0, "21600",
      "Redis/SQS redelivery timeout; must exceed `REELBATCH_MAX_RENDER_S` (celery#2599)"),
    # Money (prices: jobs.cost.prices' Rate, StoragePrice and Price).
    V("REELBATCH_GPU_HOUR_USD", "prices.gpu.usd_per_hour", positive, 5.41, "5.41",
      "the price of one GPU-hour, for cost records (`reelbatch worker --gpu-rate`)"),
    V("REELBATCH_GPU_HOUR_SOURCE", "prices.gpu.source", text, DEFAULT_GPU_HOUR_SOURCE, DEFAULT_GPU_HOUR_SOURCE,
      "where that price comes from; stored with every cost record"),
    V("REELBATCH_STORAGE_GB_MONTH_USD", "prices.storage.gb_month_usd", price, 0.023, "0.023",
      "storage price per GB-month, charged on each stored video"),
    V("REELBATCH_RETENTION_MONTHS", "prices.storage.months", price, 1.0, "1",
      "months a video is kept, for its storage charge"),
    V("REELBATCH_EGRESS_GB_USD", "prices.storage.egress_gb_usd", price, 0.0, "0",
      "egress price per GB, charged once per video when set (0: not charged)"),
    V("REELBATCH_STORAGE_SOURCE", "prices.storage.source", text, DEFAULT_STORAGE_SOURCE, DEFAULT_STORAGE_SOURCE,
      "where those prices come from, stored with each record"),
    V("REELBATCH_PRICE_PER_VIDEO_S", "prices.sale.usd_per_video_s", positive, 0.06, "0.06",
      "what a second of generated video sells for, for gross margin in reports and capacity plans"),
    V("REELBATCH_PRICE_SOURCE", "prices.sale.source", text, DEFAULT_PRICE_SOURCE, DEFAULT_PRICE_SOURCE,
      "where that price comes from"),
    # Reports (reports: jobs.settings.groups.Reports).
    V("REELBATCH_REPORT_SQL", "reports.sql", switch, True, "`1`",
      "`1`/`0`: on PostgreSQL, `reelbatch report` (text and `--json`) has the server count and sum a run's videos "
      "and write `--json`'s entries, instead of reading every video into Python (the same output; a 100,000-video "
      "run's report took 10 s that way, docs/SCALE.md)"),
    V("REELBATCH_REPORT_PARALLEL", "reports.parallel", switch, True, "`1`",
      "`1`/`0`: with `REELBATCH_REPORT_SQL`, `reelbatch report --json` reads the per-video entries on a second "
      "connection, in the same snapshot, while the first counts the run's figures (the same output; up to 0.5 s less "
      "for a 100,000-video run where a core is free, docs/SCALE.md)"),
)


