"""Wan 2.2 through the engine's other features: long videos in chunks (both ties), lossy accelerators behind their
gates (on both experts), compiled blocks of both experts, and the idle expert kept in CPU memory."""

import dataclasses
import os
from datetime import datetime, timezone

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.frames.metrics import psnr
from engine.levers import gates
from engine.levers.config import EngineConfig
from engine.levers.gates import UngatedSetting
from engine.loop.experts import experts
from engine.models.file import load_registry
from engine.types import RenderBatch, RenderRequest

from .wan22 import A14B, REQUESTS, SHAPES, TI2V, frames, write_models_file

both = pytest.mark.parametrize("model", [A14B, TI2V])


def with_model(registry, model: str, **changes):
    """`registry` with `model`'s registration changed."""
    return dataclasses.replace(registry, models={**registry.models,
                                                 model: dataclasses.replace(registry.get(model), **changes)})


# Tokens per latent frame at the test shapes: A14B 64x48 -> 8x6 latents -> 4x3 patches; TI2V 96x64 -> 6x4 -> 3x2.
TOKENS_PER_FRAME = {A14B: 12, TI2V: 6}


@both
@pytest.mark.parametrize("tie", ["noised", "clean"])
def test_a_long_video_renders_in_chunks_with_either_tie(model_cache, wan22, model, tie):
    """17 frames (5 latents) in windows of 9 frames (3 latents) overlapping by 2: 3 chunks, each starting from the
    last 2 latents of the one before. Clean, the tied tokens get timestep 0 (TI2V's per-token timesteps and the tie
    compose: 0 on the tie, the step's elsewhere); noised, every token has the step's timestep."""
    registry = with_model(wan22, model, max_frames=9, chunk_condition=tie)
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    pipe = engine.pipeline(model)
    seen = []
    hooks = [m.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["timestep"].clone()),
                                         with_kwargs=True) for m in experts(pipe)]
    try:
        video, chunks = engine.render_long(SHAPES[model], RenderRequest(1, "a long one", None, 11),
                                           registry.get(model).chunk_plan(17))
    finally:
        for hook in hooks:
            hook.remove()
    assert video.error is None and video.frames.shape == (17, SHAPES[model].height, SHAPES[model].width, 3)
    assert len(chunks) == 3 and all(c.shape[1] == 3 for c in chunks)
    for before, after in zip(chunks, chunks[1:]):
        assert torch.equal(after[:, :2], before[:, -2:]), "a chunk begins where the one before ends"
    assert video.seam_score is not None
    tokens = 3 * TOKENS_PER_FRAME[model]
    tied = 2 * TOKENS_PER_FRAME[model]
    steps = SHAPES[model].steps
    assert len(seen) == 3 * steps, "one call a step: guidance batched"
    for k in range(3):
        for t in seen[k * steps: (k + 1) * steps]:
            if tie == "noised" or k == 0:
                if model == A14B:
                    assert t.shape == (2,)
                else:
                    assert t.shape == (2, tokens) and torch.all(t == t[0, 0])
            else:
                assert t.shape == (2, tokens)
                assert torch.all(t[:, :tied] == 0) and torch.all(t[:, tied:] == t[0, -1]) and t[0, -1] > 0


def record_gate(cache_dir, registry, model: str, setting: str) -> None:
    identity = Engine(EngineConfig(cache_dir=cache_dir), registry).gate_identity(registry.get(model))
    gates.record(cache_dir, gates.Gate(model=model, identity=identity, setting=setting, count=32, batch=8,
                                       speedup=1.5, psnr_db_min=30, psnr_db_mean=35, ssim_min=0.9, adherence={},
                                       exact_adherence={}, measured_at=datetime.now(timezone.utc).isoformat()))


@both
def test_lossy_settings_wait_for_a_gate_and_then_work_on_both_experts(tmp_path, wan22, model):
    """A gate's identity covers both experts' files (transformer_2 is among ALL_PARTS). Forced: fewer steps are the
    shorter schedule bit for bit; the first-block cache, on every expert, changes what a threshold every step
    passes changes."""
    with pytest.raises(UngatedSetting, match=f"step_scale=0.5 has no recorded quality gate for model '{model}'"):
        Engine(EngineConfig(cache_dir=tmp_path, step_scale=0.5), wan22).render(RenderBatch(SHAPES[model], REQUESTS))
    record_gate(tmp_path, wan22, model, "step_scale=0.5")
    half = frames(Engine(EngineConfig(cache_dir=tmp_path, step_scale=0.5), wan22), model)
    short = frames(Engine(EngineConfig(cache_dir=tmp_path), wan22), model,
                   shape=dataclasses.replace(SHAPES[model], steps=2))
    assert all(np.array_equal(a, b) for a, b in zip(half, short))

    exact = frames(Engine(EngineConfig(cache_dir=tmp_path), wan22), model)
    record_gate(tmp_path, wan22, model, "step_cache=1")
    cached = Engine(EngineConfig(cache_dir=tmp_path, step_cache=1.0), wan22)
    assert all(psnr(a, b) < 60 for a, b in zip(frames(cached, model), exact)), "every step reuses blocks"
    assert all(m.is_cache_enabled for m in experts(cached.pipeline(model)))
    assert len(experts(cached.pipeline(model))) == (2 if model == A14B else 1)


def test_compiled_blocks_of_both_experts_render_what_eager_ones_do(tmp_path, model_cache, wan22, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    eager = frames(Engine(EngineConfig(cache_dir=model_cache), wan22), A14B)
    engine = Engine(EngineConfig(cache_dir=model_cache, compile=True), wan22)
    compiled = frames(engine, A14B)
    pipe = engine.pipeline(A14B)
    assert all(block._compiled_call_impl is not None for m in experts(pipe) for block in m.blocks)
    assert len(experts(pipe)) == 2
    for a, b in zip(eager, compiled):
        diff = np.abs(a.astype(int) - b.astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.05, (diff.max(), diff.mean())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def test_the_idle_expert_waits_in_cpu_memory_and_output_does_not_change(model_cache, tmp_path):
    """offload_idle_expert: every step runs on the expert the swap has on the device, the swap brings the low-noise
    one in at the boundary and the high-noise one back at the next batch's first step (2 moves a batch), and the
    videos are the ones rendered with both experts resident. Here the device is the CPU, so a move copies nothing;
    tests/gpu checks where the weights are and times a swap."""
    registry = load_registry(write_models_file(tmp_path, model_cache, a14b="offload_idle_expert: true"))
    assert registry.get(A14B).offload_idle_expert
    resident = Engine(EngineConfig(cache_dir=model_cache), load_registry(write_models_file(tmp_path, model_cache)))
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    pipe = engine.pipeline(A14B)
    swap = engine.swaps[A14B]
    assert A14B not in resident.swaps
    steps = []
    hooks = [m.register_forward_pre_hook(
        lambda module, args, name=name: steps.append((name, swap.active is module)))
        for name, m in (("transformer", pipe.transformer), ("transformer_2", pipe.transformer_2))]
    try:
        for requests in (REQUESTS, REQUESTS[:1]):
            offloaded = frames(engine, A14B, requests)
            assert all(np.array_equal(a, b) for a, b in zip(offloaded, frames(resident, A14B, requests)))
    finally:
        for hook in hooks:
            hook.remove()
    # Per batch, 4 steps of one batched call: 2 on each expert, each the active one.
    assert steps == [("transformer", True)] * 2 + [("transformer_2", True)] * 2 + \
        [("transformer", True)] * 2 + [("transformer_2", True)] * 2
    assert [name for name, _ in swap.moves] == ["transformer", "transformer_2", "transformer", "transformer_2"]
    assert all(seconds >= 0 for _, seconds in swap.moves)


def test_offloading_a_one_transformer_model_is_refused(model_cache, tmp_path):
    from engine.errors import ModelNotFound

    with pytest.raises(ModelNotFound, match="model 'ti2v': offload_idle_expert is for two-expert folders"):
        load_registry(write_models_file(tmp_path, model_cache, ti2v="offload_idle_expert: true"))
