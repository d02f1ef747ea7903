"""The text-embedding cache: exact (a cached render is bit-identical), shared through disk, never stale."""

import os

import numpy as np
import torch

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.levers.text_cache import TextEmbeddingCache, model_identity
from engine.models.registry import Registry
from engine.models.tiny import ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape

SHAPE = Shape("tiny", 32, 32, 5, 2, 5.0)
BATCH = RenderBatch(SHAPE, (RenderRequest(1, "a red circle", None, 1), RenderRequest(2, "a blue square", "dark", 2),
                            RenderRequest(3, "a red circle", None, 3)))


def render(engine):
    return [v.frames for v in engine.render(BATCH)]


def test_cached_renders_are_identical_to_uncached_and_the_encoder_runs_once_per_text(model_cache, tmp_path):
    ensure_tiny(model_cache)
    plain = render(Engine(EngineConfig(cache_dir=model_cache, text_cache=False), Registry()))
    config = EngineConfig(cache_dir=model_cache)
    engine = Engine(config, Registry())
    engine.text_cache.folder = tmp_path / "embeddings"
    first = render(engine)
    # 3 prompts (2 distinct) and 3 negatives ("" twice, "dark"): 6 lookups, all misses the first time.
    assert (engine.text_cache.stats.hits, engine.text_cache.stats.misses) == (0, 6)
    calls = []
    hook = engine.pipeline("tiny").text_encoder.register_forward_hook(lambda *args: calls.append(1))
    second = render(engine)
    assert calls == [] and engine.text_cache.stats.hits == 6
    engine.render(RenderBatch(SHAPE, (RenderRequest(4, "a new prompt", None, 4),)))
    hook.remove()
    assert len(calls) == 1, "a new text is encoded (the empty negative prompt is cached)"
    for a, b, c in zip(plain, first, second):
        assert np.array_equal(a, b) and np.array_equal(b, c)
    # Five distinct texts were written to disk; a new process (a new engine) reads them instead of encoding.
    assert len(list((tmp_path / "embeddings").rglob("*.safetensors"))) == 5
    fresh = Engine(config, Registry())
    fresh.text_cache.folder = tmp_path / "embeddings"
    assert all(np.array_equal(a, b) for a, b in zip(render(fresh), plain))
    assert (fresh.text_cache.stats.hits, fresh.text_cache.stats.misses) == (6, 0)


def test_keys_change_with_model_dtype_length_and_text():
    base = TextEmbeddingCache.key("m", torch.float32, 64, "a")
    assert len({base, TextEmbeddingCache.key("m2", torch.float32, 64, "a"),
                TextEmbeddingCache.key("m", torch.bfloat16, 64, "a"), TextEmbeddingCache.key("m", torch.float32, 512, "a"),
                TextEmbeddingCache.key("m", torch.float32, 64, "b")}) == 5


def test_a_changed_text_encoder_is_a_new_identity(tmp_path):
    (tmp_path / "text_encoder").mkdir()
    weights = tmp_path / "text_encoder" / "model.safetensors"
    weights.write_bytes(b"x" * 10)
    (tmp_path / "text_encoder" / "config.json").write_text('{"d_model": 32}')
    first = model_identity(tmp_path)
    assert model_identity(tmp_path) == first
    weights.write_bytes(b"y" * 11)
    second = model_identity(tmp_path)
    os.utime(weights, ns=(1, 1))
    third = model_identity(tmp_path)
    (tmp_path / "text_encoder" / "config.json").write_text('{"d_model": 64}')
    assert len({first, second, third, model_identity(tmp_path)}) == 4


def test_a_damaged_entry_is_a_miss_and_is_rewritten(tmp_path):
    cache = TextEmbeddingCache(tmp_path)
    encode = lambda texts: torch.ones(len(texts), 4, 2)  # noqa: E731
    cache.embeddings("m", torch.float32, 4, ["a"], encode)
    (path,) = tmp_path.rglob("*.safetensors")
    path.write_bytes(b"not a safetensors file")
    again = TextEmbeddingCache(tmp_path)
    assert torch.equal(again.embeddings("m", torch.float32, 4, ["a"], encode), torch.ones(1, 4, 2))
    assert again.stats.misses == 1 and TextEmbeddingCache(tmp_path).embeddings(
        "m", torch.float32, 4, ["a"], lambda t: 1 / 0).shape == (1, 4, 2)


def test_the_memory_tier_is_bounded():
    cache = TextEmbeddingCache(None, capacity=2)
    for text in "abc":
        cache.embeddings("m", torch.float32, 4, [text], lambda t: torch.zeros(len(t), 4, 2))
    assert len(cache._memory) == 2
