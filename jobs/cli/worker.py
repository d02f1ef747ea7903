"""`reelbatch worker`: a Celery worker that claims and renders queued work, with this command's settings."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.console import fail
from jobs.db.connect import session_factory
from jobs.errors import ReelbatchError, UsageError
from jobs.settings import Settings
from jobs.settings.readers import BadValue, device_list, model_names


def worker(
    queue: Annotated[Optional[str], typer.Option(help="Queue to consume (default REELBATCH_QUEUE, else render).")] = None,
    concurrency: Annotated[int, typer.Option(help="Processes that render (one per GPU).")] = 1,
    pool: Annotated[str, typer.Option(help="solo: render in this process; prefork: in child processes, with hard "
                                           "time limits (CUDA starts only in the children).")] = "solo",
    max_batch: Annotated[Optional[int], typer.Option(min=1, help="Largest same-shape batch (default REELBATCH_MAX_BATCH).")] = None,
    models: Annotated[Optional[str], typer.Option(help="Comma-separated models to serve: claim only their work "
                                                       "(default REELBATCH_WORKER_MODELS, else every registered model).")] = None,
    max_models: Annotated[Optional[int], typer.Option(min=1, help="Pipelines kept loaded; another unloads the least "
                                                                  "recently used (default REELBATCH_MAX_MODELS).")] = None,
    gpu_rate: Annotated[Optional[float], typer.Option(min=0.000001, help="USD per GPU-hour for cost records (default REELBATCH_GPU_HOUR_USD).")] = None,
    warm: Annotated[Optional[bool], typer.Option("--warm/--no-warm", help="Render one step of each shape waiting "
                                                 "most before the first claim (default REELBATCH_WARM).")] = None,
    envelope: Annotated[Optional[str], typer.Option(help="use, measure (a missing memory envelope at start) or off "
                                                         "(default REELBATCH_ENVELOPE, else use).")] = None,
    ulysses: Annotated[Optional[int], typer.Option(min=1, help="Ranks that split each video's tokens: one worker of "
                                                   "ulysses x cfg-parallel ranks on this machine (default "
                                                   "REELBATCH_ULYSSES, else 1).")] = None,
    ring: Annotated[Optional[int], typer.Option(min=1, help="Ranks that split each video's tokens by Ring attention, "
                                                "times --ulysses; gated (default REELBATCH_RING, else 1).")] = None,
    cfg_parallel: Annotated[Optional[int], typer.Option(min=1, max=2, help="2: the guided passes on two halves of "
                                                        "the ranks (default REELBATCH_CFG_PARALLEL, else 1).")] = None,
    gpus: Annotated[Optional[str], typer.Option(help="The GPUs of a worker of several ranks, one a rank: 0,1,2,3 "
                                                     "(default REELBATCH_GPUS, else the first).")] = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    log_format: Annotated[str, typer.Option("--log-format", help="text, or json: one JSON object per line, with "
                                                                 "the batch's run and video ids.")] = "text",
    grace: Annotated[Optional[float], typer.Option(min=0, help="After SIGTERM, stop the batch in hand at its next "
                                                   "step and hand it back if it cannot finish within this many "
                                                   "seconds (a spot instance's notice, less the time to exit); "
                                                   "default: always finish it.")] = None,
    parent_pid: Annotated[Optional[int], typer.Option(hidden=True, help="`reelbatch run`'s pid: stop when it is "
                                                      "gone.")] = None,
    notices: Annotated[Optional[Path], typer.Option(hidden=True, help="`reelbatch run`'s file: what each signal "
                                                    "made the worker do, as JSON lines.")] = None,
) -> None:
    """Run a Celery worker that claims and renders queued work.

    SIGTERM or Ctrl-C: take no new work, finish the batch in hand (within --grace), then stop. Again, or SIGQUIT:
    stop the batch at its next step and hand it back."""
    if pool not in ("solo", "prefork"):
        fail(UsageError(f"--pool must be solo or prefork, got {pool!r}"))
    if log_format not in ("text", "json"):
        fail(UsageError(f"--log-format must be text or json, got {log_format!r}"))
    if envelope not in (None, "use", "measure", "off"):
        fail(UsageError(f"--envelope must be use, measure or off, got {envelope!r}"))
    if pool == "solo" and concurrency != 1:
        fail(UsageError("--pool solo renders in one process: use --pool prefork for --concurrency above 1"))
    # Here, not at the top: Celery and the render path (torch) only for the command that renders.
    from jobs.work import process
    from jobs.work.app import check_worker_config, control_queue, create_app, declare_queues
    from jobs.work.tickets import model_queue

    try:
        options = {"worker.max_batch": max_batch, "prices.gpu.usd_per_hour": gpu_rate, "worker.queue": queue,
                   "worker.models": _names(models), "engine.max_models": max_models, "worker.warm": warm,
                   "worker.envelope": envelope, "engine.ulysses": ulysses, "engine.cfg_parallel": cfg_parallel, "engine.ring": ring,
                   "worker.gpus": _gpus(gpus)}
        settings = Settings.from_env().with_values({k: v for k, v in options.items() if v is not None})
        session_factory(settings.database_url)  # refuse to start against a schema this code does not know
        served = settings.served_models()
        settings.engine_config()
        check_worker_config(settings)
        check_ranks(settings, served, pool, concurrency)
        from jobs.quality.evaluate import check_precisions  # here: torch only for the command that renders

        check_precisions(settings, settings.registry(), served)  # a served model's precision, before any claim
    except ReelbatchError as exc:
        fail(exc)
    # The task processes read these options from this process's state (a prefork child inherits it when it
    # forks), never from the environment.
    process.configure(process.WorkerOptions(settings, pool=pool, log_format=log_format, grace_s=grace,
                                            parent_pid=parent_pid, notices=notices))
    app = create_app(settings)
    app.set_current()
    app.set_default()  # threads of this process (the sweeper) send tickets through it
    # The plain queue, the control queue, and one queue per model served: a model's tickets wake only its servers.
    queue = settings.worker.queue
    queues = [queue, control_queue(settings), *(model_queue(queue, m) for m in served)]
    declare_queues(app, queues)
    try:
        app.worker_main(["worker", "-Q", ",".join(queues), "-c", str(concurrency), "-P", pool, "-l", loglevel,
                         "--without-gossip", "--without-mingle"])
    finally:
        # Celery has stopped: the batch is recorded, the session closed. The interpreter's last collection would
        # walk every object torch and diffusers made, 4.7-6.6 s on a busy 2-core machine; frozen out of it, the
        # exit takes 0.8-1.2 s (3 runs each of importing them and exiting).
        gc.freeze()


def check_ranks(settings: Settings, served: tuple[str, ...], pool: str, concurrency: int) -> None:
    """A worker of several ranks (engine.group): its GPUs made the only ones CUDA sees here (rank r on cuda:r),
    before anything starts CUDA, then its layout checked (jobs.usecases.parallel)."""
    import os

    import torch

    from jobs.usecases import parallel

    if settings.worker.gpus is not None and settings.engine.device != "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, settings.worker.gpus))
    parallel.check_worker(settings, served, pool, concurrency,
                          torch.cuda.device_count() if torch.cuda.is_available() else None)


def _gpus(raw: str | None) -> tuple[int, ...] | None:
    if raw is None:
        return None
    try:
        return device_list(raw)
    except BadValue as exc:
        fail(UsageError(f"--gpus: {exc}, got {raw!r}"))


def _names(raw: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    try:
        return model_names(raw)
    except BadValue as exc:
        fail(UsageError(f"--models: {exc}, got {raw!r}"))
