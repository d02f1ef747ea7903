"""One video across ranks (issue 44, first part): Ulysses on 2 CPU ranks (torch.distributed's gloo, started by
engine.parallel.spawn) renders the same bytes as one process, for tiny and the toy model, a batch of 2 with
guidance; so do CFG parallel on 2 ranks and both on 4 (2 x 2), against one process running the two passes as two
calls; a layout that does not divide the heads or the tokens is refused with the numbers; and the one diffusers
workaround is still needed (this fails once diffusers places ranks on a CPU build by itself: then remove
engine.parallel._one_accelerator)."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.parallel import Layout, problem, spawn
from engine.types import RenderBatch, RenderRequest, Shape

REQUESTS = (RenderRequest(1, "a red circle moving right", None, 11), RenderRequest(2, "a blue square", None, 12))
SHAPES = {"tiny": Shape("tiny", 64, 64, 9, 3, 5.0), "toy": Shape("toy", 32, 32, 9, 3, 2.0)}


def hashes(config: EngineConfig, model: str) -> list[str]:
    engine = Engine(config, Registry())
    out = engine.render(RenderBatch(SHAPES[model], REQUESTS))
    return [hashlib.sha256(v.frames.tobytes()).hexdigest() for v in out]


def _rank(rank: int, config: EngineConfig, models: list[str], probe: bool) -> dict:
    import torch
    from diffusers import ContextParallelConfig

    found = {m: hashes(config, m) for m in models}
    if not probe:
        return found
    # 48x48, 9 frames on tiny: 3 latent frames x 3 x 3 patches = 27 tokens, which 2 ranks cannot split.
    try:
        Engine(config, Registry()).render(RenderBatch(Shape("tiny", 48, 48, 9, 3, 5.0), REQUESTS[:1]))
    except Exception as exc:  # noqa: BLE001 - what the engine said
        found["odd"] = str(exc)
    # diffusers' own placement on a CPU build, without the workaround.
    transformer = Engine(dataclasses.replace(config, ulysses=1), Registry()).pipeline("tiny").transformer
    try:
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
        found["upstream"] = "placed"
    except ZeroDivisionError:
        found["upstream"] = "ZeroDivisionError"
    found["devices"] = torch.accelerator.device_count()
    return found


def _alone(rank: int, config: EngineConfig, models: list[str]) -> dict:
    return {m: hashes(config, m) for m in models}


def one_process(config: EngineConfig) -> dict:
    """One process's hashes, from a fresh interpreter as each rank's are (this test process's torch state, left by
    tests run before it, once gave tiny other bytes in CI)."""
    (found,) = spawn(_alone, (config, models()), ranks=1, backend=None)
    return found


def models() -> list[str]:
    return ["tiny"] + (["toy"] if "toy" in Registry().models else [])


def test_ulysses_on_two_ranks_renders_the_bytes_of_one_process(model_cache):
    one = EngineConfig(cache_dir=model_cache)
    alone = one_process(one)
    ranks = spawn(_rank, (dataclasses.replace(one, ulysses=2), models(), True), ranks=2)
    for rank in ranks:
        for m in models():
            assert rank[m] == alone[m], m
        assert rank["odd"] == ("tiny|48x48|f9|s3|g5: ulysses 2 does not divide the video's 27 latent tokens: choose a "
                               "size whose tokens it divides")
        if rank["devices"] == 0:  # a CPU build
            assert rank["upstream"] == "ZeroDivisionError", "diffusers places CPU ranks itself now: drop the workaround"


@pytest.mark.parametrize("ulysses, cfg", [(1, 2), (2, 2)])
def test_cfg_parallel_alone_and_with_ulysses_renders_the_bytes_of_one_process(model_cache, ulysses, cfg):
    # The two passes as two calls, as one process runs them with batched guidance off (batched, one call of twice
    # the batch may round its matmuls otherwise: engine.loop.guidance).
    one = EngineConfig(cache_dir=model_cache, batched_guidance=False)
    alone = one_process(one)
    ranks = spawn(_rank, (dataclasses.replace(one, ulysses=ulysses, cfg_parallel=cfg), models(), False),
                  ranks=ulysses * cfg)
    assert len(ranks) == ulysses * cfg
    for rank in ranks:
        assert rank == alone


@pytest.mark.parametrize("layout, heads, tokens, said", [
    (Layout(2), 2, 48, None),
    (Layout(4), 2, 48, "ulysses 4 does not divide the transformer's 2 attention heads (each rank takes heads/4 of "
                       "them): use a divisor of 2"),
    # Wan2.1-1.3B: 12 heads, so no 8 ranks.
    (Layout(8), 12, 32760, "ulysses 8 does not divide the transformer's 12 attention heads (each rank takes heads/8 "
                           "of them): use a divisor of 12"),
    (Layout(4), 12, 32760, None),  # 832x480, 81 frames: 21 x 30 x 52 = 32,760 tokens, 8,190 a rank
    (Layout(0), 12, 32760, "ulysses must be at least 1, got 0"),
    (Layout(2, cfg=3), 12, 32760, "cfg must be 1 or 2 (the conditional and the unconditional pass), got 3"),
    # Ring splits tokens, not heads: 12 heads, ring 8 is fine; 27 tokens (tiny at 48x48) split by neither 2 nor 2 x 2.
    (Layout(1, ring=8), 12, 32760, None),
    (Layout(1, ring=2), 2, 27, "ulysses 1 x ring 2 = 2 does not divide the video's 27 latent tokens: choose a size "
                               "whose tokens it divides"),
    (Layout(2, ring=2), 2, 48, None),
    (Layout(1, ring=0), 12, 32760, "ring must be at least 1, got 0"),
])
def test_a_layout_must_divide_heads_and_tokens(layout, heads, tokens, said):
    assert problem(layout, heads, tokens) == said


def _frames(rank: int, config: EngineConfig, models: list[str]) -> dict:
    import torch

    torch.set_num_threads(1)  # every side at one thread: torch's thread count alone changes the float sums
    engine = Engine(config, Registry(), measuring=models)  # Ring is gated: measured here, as the gate's bench does
    return {m: [v.frames for v in engine.render(RenderBatch(SHAPES[m], REQUESTS))] for m in models}


def test_ring_on_two_ranks_renders_within_one_level_of_one_process(model_cache):
    """Ring attention merges each rank's partial attention by its log-sum-exp: other rounding, so not the bytes of
    one process, but within one level of 255 anywhere (it is gated as a lossy lever: tests/e2e/test_group_worker.py).
    """
    import numpy as np

    one = EngineConfig(cache_dir=model_cache)
    (alone,) = spawn(_frames, (one, models()), ranks=1, backend=None)
    ranks = spawn(_frames, (dataclasses.replace(one, ring=2), models()), ranks=2)
    for m in models():
        for ring, single in zip(ranks[0][m], alone[m]):
            assert np.abs(ring.astype(np.int16) - single.astype(np.int16)).max() <= 1, m
        assert all((a == b).all() for a, b in zip(ranks[0][m], ranks[1][m]))  # every rank ends with the same frames


def test_the_cpu_ring_workaround_is_still_needed():
    """diffusers' native attention op refuses the log-sum-exp Ring asks it for (engine.parallel._cpu_ring_lse): this
    fails once it returns it, so the workaround can go."""
    import torch
    from diffusers.models import attention_dispatch as dispatch

    op = dispatch._native_attention_forward_op
    op = getattr(op, "__wrapped__", op)
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="does not support return_lse"):
        op(None, q, q, q, return_lse=True, _save_ctx=False)


def test_a_layout_needs_its_ranks():
    assert problem(Layout(2), 12, 32760, world=4) == "the layout needs 2 ranks, 4 are running"
    assert problem(Layout(2, cfg=2), 12, 32760, world=4) is None


def _dies(rank: int) -> int:
    import os
    import time

    import torch.distributed as dist

    if rank == 1:
        os._exit(9)  # as a killed rank: no word to the parent
    dist.barrier()  # rank 0 waits for it, as in a collective of a render
    time.sleep(60)
    return rank


def test_a_rank_that_dies_stops_the_group_at_once():
    import time

    started = time.monotonic()
    # Either the survivor's collective fails (gloo sees the peer gone) or the parent sees the dead rank first.
    with pytest.raises(RuntimeError, match=r"rank 0 of 2 failed|2 ranks: rank 1 exited with 9 before it answered"):
        spawn(_dies, (), ranks=2, timeout_s=600)
    assert time.monotonic() - started < 60
