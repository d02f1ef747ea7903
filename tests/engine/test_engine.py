"""The engine on the built-in tiny model: real diffusers components, random weights, on the CPU."""

import dataclasses
import os

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.errors import ModelNotFound, RenderError, RetryableRenderError
from engine.levers.config import EngineConfig
from engine.models.registry import TINY, Registry
from engine.models.tiny import TINY_VERSION, ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape

SHAPE = Shape("tiny", 64, 48, 9, 3, 5.0)


@pytest.fixture(scope="module")
def engine(model_cache):
    return Engine(EngineConfig(cache_dir=model_cache), Registry())


def test_tiny_is_built_once_and_loaded_from_the_cache(model_cache):
    path = ensure_tiny(model_cache)
    assert path.name == TINY_VERSION and (path / "model_index.json").is_file()
    weights = sorted(p.relative_to(path) for p in path.rglob("*.safetensors"))
    assert {p.parts[0] for p in weights} >= {"transformer", "vae", "text_encoder"}
    assert not list(path.rglob("*.bin")), "weights must be safetensors only"
    mtime = (path / "model_index.json").stat().st_mtime_ns
    assert ensure_tiny(model_cache) == path
    assert (path / "model_index.json").stat().st_mtime_ns == mtime, "a second call must not rebuild"


def test_render_returns_uint8_frames_of_the_requested_shape(engine):
    out = engine.render(RenderBatch(SHAPE, (RenderRequest(1, "a red circle moving left", None, 7),)))
    (video,) = out
    assert video.error is None
    assert video.frames.dtype == np.uint8
    assert video.frames.shape == (9, 48, 64, 3)
    assert video.frames.std() > 1.0, "random weights give noise, never a flat image"


def test_a_video_renders_the_same_alone_or_in_a_batch(engine):
    requests = tuple(RenderRequest(i, f"prompt number {i}", "blurry" if i == 2 else None, 1000 + i)
                     for i in range(3))
    batched = engine.render(RenderBatch(SHAPE, requests))
    for i, request in enumerate(requests):
        (alone,) = engine.render(RenderBatch(SHAPE, (request,)))
        diff = np.abs(alone.frames.astype(int) - batched[i].frames.astype(int))
        # Float tolerance: batched matmuls may round differently; one uint8 step at most, almost never.
        assert diff.max() <= 1 and diff.mean() < 0.01, (i, diff.max(), diff.mean())
    assert np.abs(batched[0].frames.astype(int) - batched[1].frames.astype(int)).mean() > 5, \
        "different seeds and prompts must give different videos"


def test_same_seed_same_video(engine):
    request = (RenderRequest(1, "a blue square", None, 42),)
    a, b = engine.render(RenderBatch(SHAPE, request)), engine.render(RenderBatch(SHAPE, request))
    assert np.array_equal(a[0].frames, b[0].frames)


def test_unregistered_model_is_a_clear_error(engine):
    with pytest.raises(ModelNotFound, match="'wan-14b' is not registered"):
        engine.render(RenderBatch(Shape("wan-14b", 64, 64, 9, 2, 5.0), (RenderRequest(1, "x", None, 1),)))


@pytest.mark.parametrize("requested,expected", [(1, 5), (5, 5), (8, 9), (9, 9), (10, 9), (11, 13), (16, 17),
                                                (80, 81), (81, 81)])
def test_frame_counts_round_to_4k_plus_1(requested, expected):
    assert TINY.valid_frames(requested) == expected


def test_exact_mode_equals_one_diffusers_call_and_times_its_stages(model_cache):
    """In exact mode the engine denoises with diffusers' loop to latents and decodes itself (to time and overlap the
    stages); the frames must be exactly what the plain pipeline call gives."""
    engine = Engine(EngineConfig(cache_dir=model_cache).exact(), Registry())
    requests = (RenderRequest(1, "a red circle", None, 5), RenderRequest(2, "a blue square", "blurry", 6))
    rendered = engine.render(RenderBatch(SHAPE, requests))
    pipe = engine.pipeline("tiny")
    with torch.inference_mode():
        plain = pipe(prompt=[r.prompt for r in requests], negative_prompt=[r.negative_prompt or "" for r in requests],
                     height=SHAPE.height, width=SHAPE.width, num_frames=SHAPE.frames,
                     num_inference_steps=SHAPE.steps, guidance_scale=SHAPE.guidance,
                     generator=[torch.Generator().manual_seed(r.seed) for r in requests], output_type="np",
                     max_sequence_length=TINY.max_sequence_length).frames
    expected = np.clip(np.rint(np.asarray(plain) * 255.0), 0, 255).astype(np.uint8)
    for video, frames in zip(rendered, expected):
        assert np.array_equal(video.frames, frames)
        assert set(video.stages) == {"text", "denoise", "decode"} and all(v >= 0 for v in video.stages.values())
        assert video.stages["denoise"] > 0 and video.stages["decode"] > 0


@pytest.mark.parametrize("switch", ["batched_guidance", "fast_vae_norm"])
def test_each_fast_switch_matches_exact_mode_within_rounding(model_cache, switch):
    requests = tuple(RenderRequest(i, f"prompt {i}", "blurry" if i else None, 40 + i) for i in range(3))
    exact = Engine(EngineConfig(cache_dir=model_cache).exact(), Registry())
    fast = Engine(dataclasses.replace(EngineConfig(cache_dir=model_cache).exact(), **{switch: True}), Registry())
    for a, b in zip(exact.render(RenderBatch(SHAPE, requests)), fast.render(RenderBatch(SHAPE, requests))):
        diff = np.abs(a.frames.astype(int) - b.frames.astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.05, (diff.max(), diff.mean())
    if switch != "batched_guidance":
        return
    # Without guidance there is one pass: the two modes are the same arithmetic.
    unguided = Shape("tiny", 64, 48, 9, 3, 1.0)
    for a, b in zip(exact.render(RenderBatch(unguided, requests)), fast.render(RenderBatch(unguided, requests))):
        assert np.array_equal(a.frames, b.frames)


@pytest.mark.parametrize(("width", "frames", "message"), [(40, 9, "multiples of 16"), (64, 8, "4k\\+1 frames")])
def test_shapes_the_pipeline_would_round_are_refused(engine, width, frames, message):
    with pytest.raises(RenderError, match=message):
        engine.render(RenderBatch(Shape("tiny", width, 48, frames, 2, 5.0), (RenderRequest(1, "x", None, 1),)))


def test_out_of_memory_splits_the_batch_and_remembers_what_fitted(model_cache, monkeypatch):
    """A CPU has no device memory to run out of, so the denoiser is made to raise torch's OutOfMemoryError for
    batches over 2, as a GPU would; everything else is the real engine."""
    from engine.loop import denoise
    real, sizes = denoise.denoise, []

    def limited(pipe, **kwargs):
        sizes.append(len(kwargs["generators"]))
        if sizes[-1] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(pipe, **kwargs)

    engine = Engine(EngineConfig(cache_dir=model_cache), Registry())
    requests = tuple(RenderRequest(i, f"prompt {i}", None, 70 + i) for i in range(5))
    alone = [engine.render(RenderBatch(SHAPE, (r,)))[0].frames for r in requests]
    monkeypatch.setattr(denoise, "denoise", limited)
    sizes.clear()
    rendered = engine.render(RenderBatch(SHAPE, requests))
    assert [v.request for v in rendered] == list(requests), "every video, in order"
    for video, frames in zip(rendered, alone):
        diff = np.abs(video.frames.astype(int) - frames.astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.05  # batch size only changes float rounding
    assert sizes == [5, 3, 2, 1, 2], "5 failed, then 3 failed, then halves of at most 2"
    assert engine.max_batch[SHAPE.key()] == 2
    sizes.clear()
    engine.render(RenderBatch(SHAPE, requests[:4]))
    assert sizes == [2, 2], "later batches of the shape are split before they start"
    # One video that does not fit cannot be split: that is a retryable error for the worker.
    monkeypatch.setattr(denoise, "denoise", lambda pipe, **kw: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    with pytest.raises(RetryableRenderError, match="out of memory rendering 1 x"):
        engine.render(RenderBatch(SHAPE, requests[:1]))


def test_compiled_blocks_render_what_eager_ones_do_and_cache_their_code(tmp_path, model_cache, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unset-below")  # so teardown restores what was there
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "tiny-v1").symlink_to(ensure_tiny(model_cache))
    requests = (RenderRequest(1, "a red circle", None, 5), RenderRequest(2, "a blue square", None, 6))
    eager = Engine(EngineConfig(cache_dir=cache), Registry()).render(RenderBatch(SHAPE, requests))
    compiled_engine = Engine(EngineConfig(cache_dir=cache, compile=True), Registry())
    compiled = compiled_engine.render(RenderBatch(SHAPE, requests))
    assert compiled_engine.pipeline("tiny").transformer.blocks[0]._compiled_call_impl is not None
    for a, b in zip(eager, compiled):
        diff = np.abs(a.frames.astype(int) - b.frames.astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.05, (diff.max(), diff.mean())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")
    assert any((cache / "inductor").rglob("*.py")), "inductor wrote its generated code to the cache folder"


def test_an_attention_backend_is_chosen_by_name(model_cache):
    """torch's math kernel by name renders what SDPA's default does, to float rounding; an unusable one is refused."""
    requests = (RenderRequest(1, "a red circle", None, 5),)
    native = Engine(EngineConfig(cache_dir=model_cache), Registry()).render(RenderBatch(SHAPE, requests))
    math = Engine(EngineConfig(cache_dir=model_cache, attention="_native_math"), Registry())
    (video,) = math.render(RenderBatch(SHAPE, requests))
    diff = np.abs(video.frames.astype(int) - native[0].frames.astype(int))
    assert diff.max() <= 2 and diff.mean() < 0.05
    flash = Engine(EngineConfig(cache_dir=model_cache, attention="flash"), Registry())
    with pytest.raises(RenderError, match="attention backend 'flash' cannot run here"):
        flash.render(RenderBatch(SHAPE, requests))
