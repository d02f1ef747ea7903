"""One video across several ranks: Ulysses and Ring sequence parallelism (issue 44), through diffusers' own context
parallelism (`ContextParallelConfig`, `ModelMixin.enable_parallelism`, Wan's `_cp_plan` in its transformer).

Every rank runs the same engine on the same batch: the transformer splits its tokens across the ranks, each attention
exchanges heads for tokens (all-to-all), and every rank ends each step with the whole latents, so decoding and the
rest of the loop are unchanged. On a CPU (torch.distributed's gloo) the result is the same bytes as one process
(tests/engine/test_parallel.py); NCCL on GPUs.

What is here: the checks a layout must pass before anything renders (`problem`), applying it to a loaded
transformer (`apply`), the two workarounds diffusers needs on a CPU (`_one_accelerator`, `_cpu_ring_lse`), and
`spawn`, which starts a group of ranks on this machine and returns what each rank's function returned. CFG parallel
(`Layout.cfg` 2): the ranks form two halves, one taking the conditional pass of each guided step and the other the
unconditional, their predictions gathered (engine.loop.guidance.prediction). Ring (`Layout.ring`): each rank keeps
its share of the tokens' queries and meets every rank's keys and values in turn, the partial attentions merged by
their log-sum-exp; not bit-exact (the merge rounds otherwise), so a lever behind the quality gate. All three compose
on a cfg x ring x ulysses mesh.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """How many ranks split one video's tokens (Ulysses), and whether the guided steps' conditional and unconditional
    passes run on two halves of the ranks (`cfg` 2: CFG parallel)."""

    ulysses: int = 1
    cfg: int = 1
    ring: int = 1  # ranks that split the tokens by Ring attention (times ulysses: the ranks sharing one pass)

    @property
    def ranks(self) -> int:
        return self.ulysses * self.ring * self.cfg


# This process's CFG-parallel group and its half (0: the conditional pass, 1: the unconditional), set by `apply`.
_cfg: tuple[object, int] | None = None


def cfg_half() -> tuple[object, int] | None:
    """(the torch.distributed group of the two ranks that share this rank's tokens, this rank's half), or None."""
    return _cfg


def gather_halves(local, group):
    """The two halves' predictions, conditional first, from each rank's own (engine.loop.guidance.prediction)."""
    import torch
    import torch.distributed as dist

    both = [torch.empty_like(local), torch.empty_like(local)]
    dist.all_gather(both, local.contiguous(), group=group)
    return both[0], both[1]


def problem(layout: Layout, heads: int, tokens: int, world: int | None = None) -> str | None:
    """Why `layout` cannot render a transformer of `heads` attention heads on `tokens` latent tokens a video (with
    `world` ranks started, when known), as one sentence; None when it can."""
    u = layout.ulysses
    if u < 1:
        return f"ulysses must be at least 1, got {u}"
    if layout.ring < 1:
        return f"ring must be at least 1, got {layout.ring}"
    if layout.cfg not in (1, 2):
        return f"cfg must be 1 or 2 (the conditional and the unconditional pass), got {layout.cfg}"
    if heads % u:
        return (f"ulysses {u} does not divide the transformer's {heads} attention heads (each rank takes heads/{u} "
                f"of them): use a divisor of {heads}")
    split = u * layout.ring
    if tokens % split:
        who = f"ulysses {u}" if layout.ring == 1 else f"ulysses {u} x ring {layout.ring} = {split}"
        return f"{who} does not divide the video's {tokens} latent tokens: choose a size whose tokens it divides"
    if world is not None and world != layout.ranks:
        return f"the layout needs {layout.ranks} ranks, {world} are running"
    return None


def apply(transformer, layout: Layout) -> None:
    """Split `transformer`'s attention across the ranks of the running process group by `layout`."""
    global _cfg
    if layout.ranks == 1:
        return
    import torch.distributed as dist
    from diffusers import ContextParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized() or dist.get_world_size() != layout.ranks:
        raise RuntimeError(f"ulysses {layout.ulysses} x ring {layout.ring} x cfg {layout.cfg} needs {layout.ranks} "
                           "ranks started (engine.parallel.spawn, engine.group)")
    # Ranks r and r + ring x ulysses share tokens and take the two passes; the ranks of one half split the tokens.
    cuda = next(transformer.parameters()).is_cuda
    mesh = init_device_mesh("cuda" if cuda else "cpu", (layout.cfg, layout.ring, layout.ulysses),
                            mesh_dim_names=("cfg", "ring", "ulysses"))
    if layout.cfg > 1:
        _cfg = (mesh["cfg"].get_group(), mesh["cfg"].get_local_rank())
    if layout.ring > 1 and not cuda:
        _cpu_ring_lse()
    if layout.ulysses * layout.ring > 1:
        with _one_accelerator():
            transformer.enable_parallelism(config=ContextParallelConfig(
                ulysses_degree=layout.ulysses, ring_degree=layout.ring, mesh=mesh))
    transformer._reelbatch_layout = layout  # what engine.frames.checks.check_shape checks each shape against


@contextlib.contextmanager
def _one_accelerator():
    """diffusers (0.42) places rank r on `rank % torch.accelerator.device_count()`, which is 0 on a CPU build: a
    ZeroDivisionError. For that call only, a CPU build counts one device (the CPU, where the tensors are anyway).
    tests/engine/test_parallel.py fails once diffusers no longer needs it, so it can go."""
    import torch

    if torch.accelerator.device_count() > 0:
        yield
        return
    real = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = real


def _cpu_ring_lse() -> None:
    """diffusers (0.42) runs Ring attention's partial attentions through the backend's forward op asking for the
    log-sum-exp, which its native (SDPA) op refuses ("Native attention does not support return_lse=True"); on a GPU
    the flash and cuDNN backends return it. On a CPU, torch's own flash-attention kernel returns it: this wraps the
    native op so that a call asking for the log-sum-exp is answered by that kernel, and any other call goes on to
    diffusers' op unchanged. tests/engine/test_parallel.py fails once diffusers' op returns it itself."""
    from diffusers.models import attention_dispatch as dispatch

    native = dispatch._native_attention_forward_op
    if getattr(native, "_reelbatch_lse", False):
        return

    def forward(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        import torch

        if not return_lse or query.is_cuda or attn_mask is not None or enable_gqa:
            return native(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                          _save_ctx=_save_ctx, _parallel_config=_parallel_config)
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))  # (B, S, H, D) -> (B, H, S, D)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                              scale=scale)
        return out.permute(0, 2, 1, 3), lse.permute(0, 2, 1)  # the model's layout: (B, S, H, D) and (B, S, H)

    forward._reelbatch_lse = True
    forward.__wrapped__ = native
    dispatch._native_attention_forward_op = forward


def spawn(fn: Callable, args: tuple, ranks: int, backend: str | None = "gloo", timeout_s: float = 1800) -> list:
    """Run `fn(rank, *args)` on `ranks` processes of one torch.distributed group on this machine (gloo on CPUs, nccl
    on GPUs; None: no group, processes apart); the list of what each returned, by rank. A rank that raises or dies
    makes this raise (with its traceback when it raised)."""
    import torch.multiprocessing as mp

    port = free_port()
    context = mp.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_rank, args=(rank, ranks, port, backend, fn, args, results), daemon=True)
             for rank in range(ranks)]
    for p in procs:
        p.start()
    found: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < ranks:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                # A rank that died without a word (killed, out of memory, a crash in native code) leaves the others
                # waiting in a collective: stop them all rather than wait out the timeout.
                dead = [r for r, p in enumerate(procs) if r not in found and p.exitcode is not None]
                if dead or time.monotonic() > deadline:
                    why = (f"rank {dead[0]} exited with {procs[dead[0]].exitcode} before it answered" if dead
                           else f"no answer within {timeout_s:g} s")
                    raise RuntimeError(f"{ranks} ranks: {why}") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {ranks} failed:\n{value}")
            found[rank] = value
    finally:
        for p in procs:
            p.join(0 if len(found) < ranks else 30)
            if p.is_alive():
                p.kill()
                p.join(10)
    return [found[r] for r in range(ranks)]


def _rank(rank: int, ranks: int, port: int, backend: str, fn: Callable, args: tuple, results) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank))
    try:
        if backend is None:
            results.put((rank, True, fn(rank, *args)))
            return
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
        try:
            results.put((rank, True, fn(rank, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
        results.put((rank, False, traceback.format_exc()[-4000:]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
