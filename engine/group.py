"""One engine on several ranks of one machine (issue 44): a worker of ulysses x cfg ranks renders each video across
all of them (engine.parallel splits the transformer's attention, by Ulysses and Ring, and the guided passes).

Rank 0 is the worker's own process: it alone claims, renews the leases, decodes, encodes, stores and records, as a
one-device worker does; its engine is a `GroupEngine`. The other ranks are `follow` processes it starts (spawned,
one per device): each keeps an engine of its own and does what rank 0 tells it, by a queue of commands, when rank 0
does it: load a model (loading applies the layout, which makes the group's device mesh, a collective), and denoise a
batch (the same batch, so the same loop and the same collectives). After every denoising step rank 0 says, over the
group, whether the render stops there (a lease lost, a shutdown), so all ranks stop at the same step. Followers do
not decode: the frames come from rank 0.

Faults stop the whole group, never half of it: a follower that dies, raises, or is left waiting past the group's
timeout exits, and rank 0's watchdog then ends the worker process at once (exit status 70, nothing written): its
batch comes back when its lease ends, as a killed worker's does. A follower whose rank 0 is gone exits too.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import timedelta

import torch

from engine import parallel
from engine.engine import Engine
from engine.errors import RenderError, RenderInterrupted, device_error
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.types import RenderBatch

log = logging.getLogger(__name__)

# The worker's exit status when its group has lost a rank (EX_SOFTWARE).
GROUP_LOST = 70


@dataclass(frozen=True)
class Load:
    """Load model `name`, keeping loaded only `keep` (rank 0's pipelines after it made room)."""

    name: str
    keep: tuple[str, ...]


@dataclass(frozen=True)
class Render:
    batch: RenderBatch


QUIT = "quit"


class Group:
    """Rank 0's side of a group: the follower processes, their command queues, the control group and the watchdog.
    Made by `GroupEngine`; blocks until every rank has joined (or raises RenderError)."""

    def __init__(self, config: EngineConfig, registry: Registry, layout: parallel.Layout, timeout_s: float,
                 measuring: tuple[str, ...] = ()):
        import torch.distributed as dist
        import torch.multiprocessing as mp

        self.layout, self.timeout_s = layout, timeout_s
        ranks = layout.ranks
        cuda = config.torch_device().type == "cuda"
        if cuda and torch.cuda.device_count() < ranks:
            raise RenderError(f"ulysses {layout.ulysses} x ring {layout.ring} x cfg {layout.cfg} needs {ranks} GPUs, "
                              f"{torch.cuda.device_count()} are visible")
        backend = "nccl" if cuda else "gloo"
        port = parallel.free_port()
        threads = max(1, (os.cpu_count() or 1) // ranks)
        context = mp.get_context("spawn")
        self.queues = [context.Queue() for _ in range(ranks - 1)]
        self.procs = [context.Process(target=follow, name=f"reelbatch-rank-{r}", daemon=True,
                                      args=(r, ranks, port, backend, config, registry, self.queues[r - 1],
                                            os.getpid(), timeout_s, threads, measuring))
                      for r in range(1, ranks)]
        for p in self.procs:
            p.start()
        torch.set_num_threads(threads)
        if dist.is_initialized():
            raise RenderError("a torch.distributed group is already running in this process")
        try:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=ranks,
                                    timeout=timedelta(seconds=timeout_s))
        except Exception as exc:
            self._kill()
            raise RenderError(f"the {ranks} ranks did not join: {exc}") from exc
        self.control = dist.new_group(backend="gloo")  # the step-by-step word, on CPU tensors whatever the devices
        self.lost: str | None = None
        self.closing = False
        atexit.register(self.close)  # before multiprocessing's own exit handler ends the followers (LIFO)
        threading.Thread(target=self._watch, name="reelbatch-group-watchdog", daemon=True).start()
        log.info("group of %d ranks ready (ulysses %d x ring %d x cfg %d, %s)", ranks, layout.ulysses, layout.ring,
                 layout.cfg, backend)

    def send(self, command) -> None:
        self.check()
        for q in self.queues:
            q.put(command)

    def step(self, stop: bool) -> None:
        """After each denoising step: tell every rank whether the render stops here."""
        import torch.distributed as dist

        dist.broadcast(torch.tensor([int(stop)]), src=0, group=self.control)

    def check(self) -> None:
        """End this process if a rank has gone: the group cannot render without it."""
        for r, p in enumerate(self.procs, start=1):
            if p.exitcode is not None:
                self.lose(f"rank {r} exited with {p.exitcode}")

    def lose(self, why: str) -> None:
        log.error("group of %d ranks lost: %s; stopping the worker (status %d): its batch comes back when its "
                  "lease ends", self.layout.ranks, why, GROUP_LOST)
        self._kill()
        logging.shutdown()
        os._exit(GROUP_LOST)

    def close(self) -> None:
        """Tell the followers to quit and wait for them (a worker's normal exit, or this process's)."""
        if self.closing:
            return
        self.closing = True
        for q in self.queues:
            q.put(QUIT)
        for p in self.procs:
            p.join(10)
        self._kill()

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            if not self.closing and any(p.exitcode not in (None, 0) for p in self.procs):
                self.check()

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()


class GroupEngine(Engine):
    """Rank 0's engine: the engine, with every model load and every batch's denoising mirrored on the followers."""

    def __init__(self, config: EngineConfig, registry: Registry, *, timeout_s: float = 1800,
                 measuring: Collection[str] = ()):
        super().__init__(config, registry, measuring=measuring)
        layout = parallel.Layout(config.ulysses, config.cfg_parallel, config.ring)
        self.group = Group(config, registry, layout, timeout_s, tuple(measuring))
        self.pipelines.before_load = lambda name, keep: self.group.send(Load(name, keep))

    def _render_once(self, batch: RenderBatch, should_stop):
        self.pipeline(batch.shape.model)  # loaded first: a load is a command of its own (its mesh, a collective)
        self.group.send(Render(batch))
        stepped: list[int] = []

        def synced() -> str | None:
            stepped.append(1)
            reason = should_stop() if should_stop is not None else None
            self.group.step(reason is not None)
            return reason

        try:
            return super()._render_once(batch, synced)
        except BaseException as exc:
            # A collective fails at once when a peer dies, or after the group's timeout when one hangs; an error
            # of this rank's own mid-loop (out of memory) leaves the others waiting in the step it left. Either way
            # the group is out of step for good, and the error is not the batch's. What every rank meets alike is
            # not: a stop at a step (said to all), a refusal of the inputs before the first step.
            time.sleep(0.5)
            self.group.check()
            alike = isinstance(exc, (RenderInterrupted, RenderError)) or (not stepped and _refusal(exc))
            if _collective_error(exc) or not alike:
                self.group.lose(f"{type(exc).__name__}: {str(exc)[:300]}")
            raise


def _refusal(exc: BaseException) -> bool:
    """What Engine.render takes for the inputs' refusal before the first step (UnrenderableInput)."""
    return isinstance(exc, (ValueError, RuntimeError)) and not device_error(exc)


def _collective_error(exc: BaseException) -> bool:
    import torch.distributed as dist

    text = str(exc).lower()
    return isinstance(exc, dist.DistError) or any(w in text for w in ("gloo", "nccl", "connection closed",
                                                                      "timed out"))


def follow(rank: int, ranks: int, port: int, backend: str, config: EngineConfig, registry: Registry, commands,
           parent: int, timeout_s: float, threads: int, measuring: tuple[str, ...] = ()) -> None:
    """A follower rank: join the group, then do each command rank 0 sends, until it says quit or is gone."""
    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s", force=True)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        config = replace(config, device=f"cuda:{rank}")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks,
                            timeout=timedelta(seconds=timeout_s))
    control = dist.new_group(backend="gloo")
    engine = Engine(config, registry, measuring=measuring)
    engine.decodes = False
    while (command := commands.get()) != QUIT:
        if isinstance(command, Load):
            engine.pipelines.keep_only(command.keep)
            engine.pipeline(command.name)
        elif isinstance(command, Render):
            _denoise(engine, command.batch, control)
    dist.destroy_process_group()


def _denoise(engine: Engine, batch: RenderBatch, control) -> None:
    import torch.distributed as dist

    steps: list[int] = []

    def told() -> str | None:
        steps.append(1)
        word = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(word, src=0, group=control)
        return "rank 0 stopped the render" if word.item() else None

    try:
        engine._render_once(batch, told)
    except RenderInterrupted:
        pass  # rank 0 stopped at this step too
    except RenderError as exc:
        log.info("batch %s refused: %s", batch.shape.key(), exc)  # by its inputs, on rank 0 as here
    except (ValueError, RuntimeError) as exc:
        # Refused before the first step from its inputs: rank 0, on the same inputs, refused it too (Engine.render).
        if steps or device_error(exc):
            raise
        log.info("batch %s refused before its first step: %s", batch.shape.key(), exc)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)  # rank 0 is gone: nothing here is anyone's any more
