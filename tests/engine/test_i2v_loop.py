"""The image-to-video path (`image_condition: pipeline`) in the engine's one loop (issue 32): WanImageToVideoPipeline's
inputs prepared per picture (engine.loop.i2v.prepare) and read by engine.loop.denoise as one step, so the two-expert
image model (Wan 2.2 I2V A14B, built at tiny widths with diffusers' classes and saved like a downloaded folder) gets
what the text path has: its registration's guidance_2 on the low-noise steps, the expert swap, batching of several
pictures."""

import numpy as np
import pytest
import torch
from PIL import Image

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.loop.i2v import denoise_i2v
from engine.models.file import load_registry
from engine.types import RenderBatch, RenderRequest, Shape

from .wan22 import build_i2v_a14b

SHAPE = Shape("i2v", 32, 32, 5, 4, 4.0)


def picture(seed: int) -> np.ndarray:
    cells = np.random.default_rng(seed).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return np.repeat(np.repeat(cells, 8, axis=0), 8, axis=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("i2v-a14b") / "Wan2.2-I2V-A14B-tiny"
    build_i2v_a14b().save_pretrained(path, safe_serialization=True)
    return path


def registry(tmp_path, folder, extra=""):
    models = tmp_path / "models.yaml"
    models.write_text(f"i2v:\n  path: {folder}\n  max_sequence_length: 64\n  image_condition: pipeline\n{extra}")
    return load_registry(models)


def test_exact_mode_equals_the_pipeline_call_with_the_registrations_guidance_2(folder, model_cache, tmp_path):
    """A batch of one through the engine's render, exact mode, against one WanImageToVideoPipeline call given the
    same picture, prompt, seed and both scales: the same frames, bit for bit."""
    engine = Engine(EngineConfig(cache_dir=model_cache).exact(), registry(tmp_path, folder, "  guidance_2: 1.5\n"))
    request = RenderRequest(1, "a red circle", "blurry", 7, image=picture(1))
    (video,) = engine.render(RenderBatch(SHAPE, (request,)))
    pipe = engine.pipeline("i2v")
    with torch.inference_mode():
        plain = pipe(image=Image.fromarray(picture(1)), prompt="a red circle", negative_prompt="blurry",
                     height=32, width=32, num_frames=5, num_inference_steps=4, guidance_scale=4.0,
                     guidance_scale_2=1.5, generator=[torch.Generator().manual_seed(7)], output_type="np",
                     max_sequence_length=64).frames
    expected = np.clip(np.rint(np.asarray(plain[0]) * 255.0), 0, 255).astype(np.uint8)
    assert np.array_equal(video.frames, expected)


def test_guidance_2_changes_the_low_noise_experts_steps_and_only_those(folder, model_cache, tmp_path):
    """Each step's latents, recorded from the scheduler: with guidance_2 1.5 and 3.0 they are equal while the
    high-noise expert runs (t at or above 0.9 x 1000) and differ from the first low-noise step on."""
    pipe = Engine(EngineConfig(cache_dir=model_cache), registry(tmp_path, folder)).pipeline("i2v")
    embeds = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(1))
    negative = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(2))
    step = pipe.scheduler.step
    runs = {}
    for scale in (1.5, 3.0):
        seen = []

        def recording(noise_pred, t, latents, **kwargs):
            out = step(noise_pred, t, latents, **kwargs)
            seen.append((float(t), out[0].clone()))
            return out

        pipe.scheduler.step = recording
        try:
            with torch.inference_mode():
                denoise_i2v(pipe, images=[picture(2)], prompt_embeds=embeds, negative_prompt_embeds=negative,
                            height=32, width=32, frames=5, steps=4, guidance=4.0, guidance_2=scale,
                            generators=[torch.Generator().manual_seed(3)])
        finally:
            del pipe.scheduler.step
        runs[scale] = seen
    high = [t >= 900 for t, _ in runs[1.5]]
    assert any(high) and not all(high), high
    for (t, a), (_, b), is_high in zip(runs[1.5], runs[3.0], high):
        assert torch.equal(a, b) == is_high, t


def test_the_idle_expert_is_swapped_on_the_image_path(folder, model_cache, tmp_path):
    engine = Engine(EngineConfig(cache_dir=model_cache), registry(tmp_path, folder, "  offload_idle_expert: true\n"))
    (video,) = engine.render(RenderBatch(SHAPE, (RenderRequest(1, "a", None, 5, image=picture(3)),)))
    assert video.error is None
    assert [name for name, _ in engine.swaps["i2v"].moves] == ["transformer", "transformer_2"]


def test_three_pictures_in_one_batch_render_as_three_alone(folder, model_cache, tmp_path):
    """Batched guidance (the default) over a batch of three: each video as it renders alone, to one uint8 step."""
    engine = Engine(EngineConfig(cache_dir=model_cache), registry(tmp_path, folder))
    requests = tuple(RenderRequest(i, f"prompt {i}", None, 20 + i, image=picture(10 + i)) for i in range(3))
    batched = engine.render(RenderBatch(SHAPE, requests))
    for request, video in zip(requests, batched):
        (alone,) = engine.render(RenderBatch(SHAPE, (request,)))
        diff = np.abs(alone.frames.astype(int) - video.frames.astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.01, request.video_id


def test_a_gated_lever_runs_on_the_image_path(folder, model_cache, tmp_path):
    """guidance_fraction 0.5 (behind its recorded gate) on 4 guided steps, guidance unbatched: the first 2 steps take
    2 transformer passes and the last 2 one each, 6 in all against exact mode's 8, counted on both experts."""
    from dataclasses import replace
    from datetime import datetime, timezone

    from engine.levers import gates
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    calls = {}
    for name, config in (("exact", EngineConfig(cache_dir=cache).exact()),
                         ("lever", replace(EngineConfig(cache_dir=cache).exact(), guidance_fraction=0.5))):
        engine = Engine(config, registry(tmp_path, folder))
        if config.lossy():
            gates.record(cache, gates.Gate(
                model="i2v", identity=engine.gate_identity(engine.registry.get("i2v")), setting=config.lossy(),
                count=32, batch=8, speedup=1.5, psnr_db_min=30, psnr_db_mean=35, ssim_min=0.9, adherence={},
                exact_adherence={}, measured_at=datetime.now(timezone.utc).isoformat(), failures=[]))
        pipe = engine.pipeline("i2v")
        count = [0]
        hooks = [m.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
                 for m in (pipe.transformer, pipe.transformer_2)]
        (video,) = engine.render(RenderBatch(SHAPE, (RenderRequest(1, "a", None, 5, image=picture(4)),)))
        for hook in hooks:
            hook.remove()
        assert video.error is None
        calls[name] = count[0]
    assert calls == {"exact": 8, "lever": 6}
