"""Checks that need an NVIDIA GPU, marked `gpu`. Collected only where REELBATCH_GPU_TESTS=1 (tests/conftest.py),
which scripts/gpu_check.sh sets on a GPU machine; there they fail rather than skip without a GPU."""

import dataclasses
import gc

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.types import RenderBatch, RenderRequest, Shape

pytestmark = pytest.mark.gpu

SHAPE = Shape("tiny", 64, 48, 9, 3, 5.0)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    assert torch.cuda.is_available(), "these tests need a CUDA device"
    return tmp_path_factory.mktemp("gpu-cache")


def test_the_engine_renders_on_the_gpu_in_bf16_and_a_video_is_the_same_alone_or_batched(cache):
    engine = Engine(EngineConfig(cache_dir=cache), Registry())
    requests = tuple(RenderRequest(i, f"prompt {i}", None, 90 + i) for i in range(4))
    batched = engine.render(RenderBatch(SHAPE, requests))
    pipe = engine.pipeline("tiny")
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.float32
    assert pipe.transformer.device.type == "cuda"
    for r, video in zip(requests, batched):
        (alone,) = engine.render(RenderBatch(SHAPE, (r,)))
        diff = np.abs(alone.frames.astype(int) - video.frames.astype(int))
        assert diff.mean() < 1.0, diff.mean()  # bf16 matmuls of another batch size round differently
        assert video.stages["denoise"] > 0 and video.stages["decode"] > 0


@pytest.mark.parametrize("switch", ["batched_guidance", "fast_vae_norm", "compile"])
def test_each_switch_stays_close_to_exact_mode_on_the_gpu(cache, switch):
    requests = tuple(RenderRequest(i, f"prompt {i}", None, 40 + i) for i in range(2))
    exact = Engine(EngineConfig(cache_dir=cache).exact(), Registry())
    fast = Engine(dataclasses.replace(EngineConfig(cache_dir=cache).exact(), **{switch: True}), Registry())
    for a, b in zip(exact.render(RenderBatch(SHAPE, requests)), fast.render(RenderBatch(SHAPE, requests))):
        diff = np.abs(a.frames.astype(int) - b.frames.astype(int))
        assert diff.mean() < 1.0, (switch, diff.mean())


def test_the_text_encoder_leaves_the_device_and_output_does_not_change(cache):
    """With the text cache on, the encoder waits in CPU memory and visits the GPU only for texts the cache lacks."""
    requests = tuple(RenderRequest(i, f"offload prompt {i}", None, 70 + i) for i in range(2))
    kept = Engine(dataclasses.replace(EngineConfig(cache_dir=cache), offload_text_encoder=False), Registry())
    offloaded = Engine(EngineConfig(cache_dir=cache / "offload", offload_text_encoder=True), Registry())
    a = kept.render(RenderBatch(SHAPE, requests))
    b = offloaded.render(RenderBatch(SHAPE, requests))  # a cold cache of its own: the encoder visits the GPU
    assert kept.pipeline("tiny").text_encoder.device.type == "cuda"
    assert offloaded.pipeline("tiny").text_encoder.device.type == "cpu"
    assert offloaded.text_cache.stats.misses >= 2
    for x, y in zip(a, b):  # the same encoder on the same device: the same embeddings
        assert np.abs(x.frames.astype(int) - y.frames.astype(int)).mean() < 0.01


def test_an_unloaded_pipeline_gives_its_device_memory_back(cache):
    """With at most one pipeline loaded, switching models frees the one that leaves: the device holds one model's
    weights at a time, not both (engine.models.pipelines.PipelineCache._make_room: collect, then empty torch's cache)."""
    request = (RenderRequest(1, "a red circle moving left on a black background", None, 5),)
    toy = RenderBatch(Shape("toy", 32, 32, 9, 2, 2.0), request)
    both = Engine(EngineConfig(cache_dir=cache, max_models=2, text_cache=False), Registry())
    both.render(toy)
    both.render(RenderBatch(SHAPE, request))
    held_both = torch.cuda.memory_allocated()
    del both
    gc.collect()
    one = Engine(EngineConfig(cache_dir=cache, max_models=1, text_cache=False), Registry())
    one.render(toy)
    one.render(RenderBatch(SHAPE, request))  # tiny in, toy out
    assert one.loaded() == ("tiny",)
    held_one = torch.cuda.memory_allocated()
    one.render(toy)  # and back
    assert one.loaded() == ("toy",)
    assert held_one < held_both and torch.cuda.memory_allocated() < held_both, (held_one, held_both)
def test_the_idle_wan22_expert_waits_in_cpu_memory_and_output_does_not_change(cache, tmp_path):
    """offload_idle_expert on a GPU: at each step the running expert's weights are on the device and the other's in
    CPU memory; the videos are those rendered with both experts resident. Prints each swap's seconds (for
    docs/PERFORMANCE.md; at tiny widths they measure the bookkeeping, not the bus)."""
    from engine.models.file import load_registry
    from tests.engine.wan22 import write_models_file

    shape = Shape("a14b", 64, 48, 9, 4, 4.0)
    requests = tuple(RenderRequest(i, f"prompt {i}", None, 20 + i) for i in range(2))
    resident = Engine(EngineConfig(cache_dir=cache), load_registry(write_models_file(tmp_path, cache)))
    offload = Engine(EngineConfig(cache_dir=cache),
                     load_registry(write_models_file(tmp_path, cache, a14b="offload_idle_expert: true")))
    pipe = offload.pipeline("a14b")
    places = []

    def where(module, args):
        other = pipe.transformer_2 if module is pipe.transformer else pipe.transformer
        places.append((next(module.parameters()).device.type, next(other.parameters()).device.type,
                       next(other.parameters()).is_pinned()))

    hooks = [m.register_forward_pre_hook(where) for m in (pipe.transformer, pipe.transformer_2)]
    try:
        for _ in range(2):
            for a, b in zip(offload.render(RenderBatch(shape, requests)), resident.render(RenderBatch(shape, requests))):
                # The same weights and kernels: expected bit for bit, allowed a step for cuBLAS's own choices.
                assert np.abs(a.frames.astype(int) - b.frames.astype(int)).max() <= 1
    finally:
        for hook in hooks:
            hook.remove()
    # 4 batched calls a batch, 2 on each expert. The low-noise expert stays as loaded (unpinned) until its first
    # swap; from then on an idle expert waits in its pinned copy.
    assert places == [("cuda", "cpu", False)] * 2 + [("cuda", "cpu", True)] * 6
    assert pipe.vae.device.type == "cuda" and pipe.text_encoder.device.type == "cuda"
    print("swaps (expert, seconds):", offload.swaps["a14b"].moves)
