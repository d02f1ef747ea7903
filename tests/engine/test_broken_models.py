"""Models broken the way users' models break (tests/engine/broken.py) are flagged or failed; normal renders of each
built-in model are not. Seeds 900-903: not the 700-747 the limits were chosen on (docs/QUALITY.md, "Checks on every
video"), so these are held-out results, four videos per model and kind in one batch each.
"""

import pytest

from engine.engine import Engine
from engine.frames.video_checks import check_video
from engine.levers.config import EngineConfig
from engine.loop import denoise
from engine.models.registry import Registry
from engine.types import RenderBatch, RenderRequest, Shape

from .broken import broken

REGISTRY = Registry()
TOY_FAMILY = [m for m in ("toy", "toy-fast", "toy-i2v") if m in REGISTRY.models]
SEEDS = range(900, 904)


@pytest.fixture(scope="module")
def engine(model_cache):
    return Engine(EngineConfig(cache_dir=model_cache), REGISTRY, measuring=list(REGISTRY.models))


def render(engine, model: str, kind: str | None = None, ours: bool = True):
    """(noise_kept, checks or None, error text or None) of each of four videos, the model broken as `kind` says;
    `ours` False renders with diffusers' own loop (noise_kept not measured)."""
    info = REGISTRY.get(model)
    d = info.defaults
    shape = Shape(model, d.width, d.height, info.valid_frames(round(d.fps * d.duration_s)), d.steps, d.guidance)
    requests = tuple(RenderRequest(i, "a red circle moving left on a gray background", None, s)
                     for i, s in enumerate(SEEDS))
    pipe = engine.pipeline(model)
    supports = denoise.supports
    try:
        if not ours:
            denoise.supports = lambda pipe: False
        if kind is None:
            videos = engine.render(RenderBatch(shape, requests))
        else:
            with broken(pipe, kind, engine.light_decoder(model)):
                videos = engine.render(RenderBatch(shape, requests))
    finally:
        denoise.supports = supports
    return [(v.noise_kept, None if v.frames is None else check_video(v.frames, info.checks, None, v.noise_kept),
             None if v.error is None else str(v.error)) for v in videos]


def flagged_or_failed(results) -> int:
    return sum(error is not None or not checks.passed for _, checks, error in results)


@pytest.mark.parametrize("model", ["tiny", *TOY_FAMILY])
def test_normal_renders_are_never_flagged(engine, model):
    results = render(engine, model)
    assert flagged_or_failed(results) == 0, [c.reason() for _, c, _ in results]
    assert all(kept < 0.9 for kept, _, _ in results)  # tiny 0.83-0.86, the toy family under 0.25


@pytest.mark.parametrize("model", ["tiny", *TOY_FAMILY])
def test_a_transformer_that_outputs_nothing_is_flagged_by_the_noise_it_kept(engine, model):
    results = render(engine, model, "proj_out")
    assert [round(kept, 4) for kept, _, _ in results] == [1.0] * 4
    assert all(c.denoised is not None and not c.denoised.passed for _, c, _ in results)
    assert flagged_or_failed(results) == 4


@pytest.mark.parametrize("model", TOY_FAMILY)
def test_decoded_noise_is_flagged_where_the_loop_is_not_ours(engine, model):
    # diffusers' own loop: noise_kept unknown, so the frames alone must say it.
    results = render(engine, model, "proj_out", ours=False)
    assert all(kept is None and c.denoised is None for kept, c, _ in results)
    assert all(not c.structure.passed for _, c, _ in results)


@pytest.mark.parametrize("kind", ["blocks_zero", "blocks_random"])
@pytest.mark.parametrize("model", TOY_FAMILY)
def test_zeroed_or_random_blocks_are_flagged(engine, model, kind):
    results = render(engine, model, kind)
    assert flagged_or_failed(results) == 4, [c.reason() for _, c, _ in results]


@pytest.mark.parametrize("kind, error", [("nan", "non-finite"), ("vae_zero", "blank frames")])
@pytest.mark.parametrize("model", ["tiny", *TOY_FAMILY])
def test_nan_weights_and_a_zeroed_decoder_fail_the_video(engine, model, kind, error):
    results = render(engine, model, kind)
    assert all(err is not None and error in err for _, _, err in results)
