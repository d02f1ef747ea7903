"""Wan 2.2 through the engine's own loop: the two-expert A14B and the TI2V (Wan 2.2 VAE, per-token timesteps) at
tiny widths, against diffusers' WanPipeline and through every engine feature."""

import dataclasses

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.errors import RenderError, RenderInterrupted, RetryableRenderError
from engine.levers.config import EngineConfig
from engine.loop import denoise
from engine.types import RenderBatch, RenderRequest, Shape

from .wan22 import A14B, REQUESTS, SHAPES, TI2V, frames

both = pytest.mark.parametrize("model", [A14B, TI2V])


def close(a: np.ndarray, b: np.ndarray, most: int = 2, mean: float = 0.05) -> None:
    """Within float rounding: matmuls of another batch size may round differently in the last bit."""
    diff = np.abs(a.astype(int) - b.astype(int))
    assert diff.max() <= most and diff.mean() < mean, (diff.max(), diff.mean())


def calls(pipe) -> tuple[list[tuple[str, tuple]], list]:
    """Hooks recording each transformer call: (which expert, its timestep's shape); remove with the second value."""
    seen = []
    hooks = [model.register_forward_pre_hook(
        lambda module, args, kwargs, name=name: seen.append((name, tuple(kwargs["timestep"].shape))),
        with_kwargs=True) for name, model in (("transformer", pipe.transformer), ("transformer_2", pipe.transformer_2))
        if model is not None]
    return seen, hooks


@pytest.mark.parametrize("model", [A14B, TI2V, "wan21"])
def test_exact_mode_is_wan_pipeline_bit_for_bit(model_cache, wan22, model):
    """The engine's loop in exact mode against one plain WanPipeline call with the published pair of scales: the
    A14B's high-noise expert for timesteps 999 and 900 (at or above 0.875 x 1000) at guidance 4, its low-noise one
    for 750 and 500 at 3; TI2V's transformer with a timestep for each of its 3 x 2 x 3 = 18 tokens; Wan 2.1 (tiny)
    as before, one transformer and a timestep per video."""
    engine = Engine(EngineConfig(cache_dir=model_cache).exact(), wan22)
    shape = SHAPES[model]
    pipe = engine.pipeline(model)
    seen, hooks = calls(pipe)
    try:
        rendered = frames(engine, model)
    finally:
        for hook in hooks:
            hook.remove()
    # Two calls a step (conditional, unconditional), of batch 2.
    assert seen == {A14B: [("transformer", (2,))] * 4 + [("transformer_2", (2,))] * 4,
                    TI2V: [("transformer", (2, 18))] * 8, "wan21": [("transformer", (2,))] * 8}[model]
    plain = {}
    for output in ("np", "latent"):
        with torch.inference_mode():
            plain[output] = pipe(
                prompt=[r.prompt for r in REQUESTS], negative_prompt=[r.negative_prompt or "" for r in REQUESTS],
                height=shape.height, width=shape.width, num_frames=shape.frames, num_inference_steps=shape.steps,
                guidance_scale=shape.guidance, guidance_scale_2=3.0 if model == A14B else None,
                generator=[torch.Generator().manual_seed(r.seed) for r in REQUESTS], output_type=output,
                max_sequence_length=64).frames
    expected = np.clip(np.rint(np.asarray(plain["np"]) * 255.0), 0, 255).astype(np.uint8)
    assert expected.shape == (2, 9, shape.height, shape.width, 3)
    for video, reference in zip(rendered, expected):
        assert np.array_equal(video, reference)
    # Before the rounding to uint8 too: the latents, bit for bit.
    chunks = engine.render(RenderBatch(shape, tuple(dataclasses.replace(r, latents_only=True) for r in REQUESTS)))
    assert torch.equal(torch.stack([v.latents for v in chunks]), plain["latent"])


def test_the_low_noise_expert_guides_with_the_registrations_scale(model_cache, wan22):
    """The registration's guidance_2 reaches the low-noise steps: its latents are the pipeline's with
    guidance_scale_2=3.0 (published), and with guidance_2 left out (null) the pipeline's default, the first scale."""
    shape = SHAPES[A14B]
    requests = tuple(dataclasses.replace(r, latents_only=True) for r in REQUESTS)
    unset = dataclasses.replace(wan22, models={**wan22.models, A14B: dataclasses.replace(wan22.get(A14B),
                                                                                         guidance_2=None)})
    rendered = {}
    for name, registry in (("published", wan22), ("unset", unset)):
        engine = Engine(EngineConfig(cache_dir=model_cache).exact(), registry)
        rendered[name] = torch.stack([v.latents for v in engine.render(RenderBatch(shape, requests))])
    pipe = engine.pipeline(A14B)
    with torch.inference_mode():  # as the engine encodes (with autograd on, UMT5 rounds differently)
        embeds = [pipe.encode_prompt(t, do_classifier_free_guidance=False, max_sequence_length=64)[0]
                  for t in ([r.prompt for r in REQUESTS], [r.negative_prompt or "" for r in REQUESTS])]
        plain = {scale: pipe(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1], height=shape.height,
                             width=shape.width, num_frames=shape.frames, num_inference_steps=shape.steps,
                             guidance_scale=shape.guidance, guidance_scale_2=scale,
                             generator=[torch.Generator().manual_seed(r.seed) for r in REQUESTS],
                             output_type="latent").frames for scale in (3.0, None)}
    assert torch.equal(rendered["published"], plain[3.0]) and torch.equal(rendered["unset"], plain[None])
    assert (plain[3.0] - plain[None]).abs().max() > 1e-3, "the two scales must lead to different latents"


@both
def test_a_video_renders_the_same_alone_or_in_a_batch(model_cache, wan22, model):
    engine = Engine(EngineConfig(cache_dir=model_cache), wan22)
    requests = tuple(RenderRequest(i, f"prompt number {i}", "blurry" if i == 2 else None, 1000 + i) for i in range(3))
    batched = frames(engine, model, requests)
    for request, video in zip(requests, batched):
        close(frames(engine, model, (request,))[0], video, most=1, mean=0.01)
    assert np.abs(batched[0].astype(int) - batched[1].astype(int)).mean() > 5, "different seeds, different videos"


@both
def test_batched_guidance_matches_exact_mode_within_rounding(model_cache, wan22, model):
    exact = frames(Engine(EngineConfig(cache_dir=model_cache).exact(), wan22), model)
    fast = dataclasses.replace(EngineConfig(cache_dir=model_cache).exact(), batched_guidance=True)
    for a, b in zip(exact, frames(Engine(fast, wan22), model)):
        close(a, b)


@both
def test_a_text_cache_hit_renders_bit_identically(model_cache, wan22, tmp_path, model):
    plain = frames(Engine(EngineConfig(cache_dir=model_cache, text_cache=False), wan22), model)
    engine = Engine(EngineConfig(cache_dir=model_cache), wan22)
    engine.text_cache.folder = tmp_path / "embeddings"
    first, second = frames(engine, model), frames(engine, model)
    # 2 prompts and 2 negatives ("", "blurry"): missed once, then read.
    assert (engine.text_cache.stats.misses, engine.text_cache.stats.hits) == (4, 4)
    assert all(np.array_equal(a, b) and np.array_equal(b, c) for a, b, c in zip(plain, first, second))


@both
def test_a_render_stops_at_the_step_it_is_told_to(model_cache, wan22, model):
    """Asked after every step; the third answer stops it, in the A14B's low-noise stage."""
    engine = Engine(EngineConfig(cache_dir=model_cache), wan22)
    asked = []

    def should_stop():
        asked.append(1)
        return "run cancelled" if len(asked) == 3 else None

    with pytest.raises(RenderInterrupted, match="run cancelled"):
        engine.render(RenderBatch(SHAPES[model], REQUESTS), should_stop)
    assert len(asked) == 3


@both
def test_out_of_memory_splits_the_batch(model_cache, wan22, monkeypatch, model):
    """As tests/engine/test_engine.py fakes it: the denoiser raises torch's OutOfMemoryError over 1 video."""
    real, sizes = denoise.denoise, []

    def limited(pipe, **kwargs):
        sizes.append(len(kwargs["generators"]))
        if sizes[-1] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(pipe, **kwargs)

    engine = Engine(EngineConfig(cache_dir=model_cache), wan22)
    alone = [frames(engine, model, (r,))[0] for r in REQUESTS]
    monkeypatch.setattr(denoise, "denoise", limited)
    sizes.clear()
    split = frames(engine, model)
    assert sizes == [2, 1, 1] and engine.max_batch[SHAPES[model].key()] == 1
    for a, b in zip(alone, split):
        assert np.array_equal(a, b), "each half is the video alone"
    monkeypatch.setattr(denoise, "denoise", lambda pipe, **kw: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    with pytest.raises(RetryableRenderError, match="out of memory rendering 1 x"):
        frames(engine, model, REQUESTS[:1])


@pytest.mark.parametrize(("model", "width", "frames_", "message"), [
    (TI2V, 80, 9, "80x64: sides must be multiples of 32 for ti2v"),  # 16 would do for WanPipeline's check
    (TI2V, 96, 10, "10 frames: ti2v renders 4k\\+1 frames"),
    (A14B, 40, 9, "40x64: sides must be multiples of 16 for a14b"),
])
def test_shapes_the_pipeline_would_round_are_refused(model_cache, wan22, model, width, frames_, message):
    engine = Engine(EngineConfig(cache_dir=model_cache), wan22)
    with pytest.raises(RenderError, match=message):
        engine.render(RenderBatch(Shape(model, width, 64, frames_, 2, 5.0), REQUESTS[:1]))
