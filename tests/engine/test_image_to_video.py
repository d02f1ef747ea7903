"""Videos that start from a picture, on the real Wan architectures at toy widths with random weights: the first
frame path (`tiny`: the picture's latent held clean with timestep 0, as Wan 2.2 TI2V) and the pipeline path
(`tiny-i2v`: Wan 2.1 I2V's image encoder and mask channels), each alone, in batches and against diffusers."""

import dataclasses

import numpy as np
import pytest
import torch

from engine.engine import Engine
from engine.errors import RenderError
from engine.frames.decode import decode_latents
from engine.levers.config import EngineConfig
from engine.long.chunks import plan
from engine.loop.first_frame import first_frame_latents
from engine.loop.i2v import denoise_i2v
from engine.models.registry import TINY, Registry
from engine.models.tiny import ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape

SHAPE = Shape("tiny", 64, 48, 9, 3, 5.0)
I2V = Shape("tiny-i2v", 64, 48, 9, 3, 5.0)


def picture(seed: int) -> np.ndarray:
    """A blocky picture: random colours on an 8x6 grid of 8 px cells, so the VAE has something to keep."""
    cells = np.random.default_rng(seed).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    return np.repeat(np.repeat(cells, 8, axis=0), 8, axis=1)


@pytest.fixture(scope="module")
def engine(model_cache):
    return Engine(EngineConfig(cache_dir=model_cache), Registry())


def close(a: np.ndarray, b: np.ndarray) -> bool:
    """As test_engine's alone-or-in-a-batch rule: batched matmuls may round differently, one uint8 step at most."""
    diff = np.abs(a.astype(int) - b.astype(int))
    return diff.max() <= 1 and diff.mean() < 0.01


def test_first_frame_holds_the_pictures_latent_clean_to_the_end(engine):
    request = RenderRequest(1, "a red circle", None, 5, image=picture(1), latents_only=True)
    (video,) = engine.render(RenderBatch(SHAPE, (request,)))
    with torch.inference_mode():
        expected = first_frame_latents(engine.pipeline("tiny"), picture(1))
    assert video.latents.shape == (16, 3, 6, 8)
    assert torch.equal(video.latents[:, :1], expected), "the first latent frame is the picture's, exactly"
    (free,) = engine.render(RenderBatch(SHAPE, (RenderRequest(1, "a red circle", None, 5, latents_only=True),)))
    assert not torch.allclose(free.latents[:, :1], expected, atol=0.1), "without the picture it is not"


def test_first_frame_of_the_video_is_the_pictures_vae_round_trip(engine):
    (video,) = engine.render(RenderBatch(SHAPE, (RenderRequest(1, "x", None, 5, image=picture(2)),)))
    pipe = engine.pipeline("tiny")
    with torch.inference_mode():
        alone = decode_latents(pipe, first_frame_latents(pipe, picture(2))[None])[0]
    expected = np.clip(np.rint(np.asarray(alone)[0] * 255.0), 0, 255).astype(np.uint8)
    # Wan's VAE decodes causally: frame 0 comes from the first latent alone, so it is what decoding the picture's
    # latent on its own gives, to rounding.
    assert np.abs(video.frames[0].astype(int) - expected.astype(int)).max() <= 1


def test_image_videos_and_text_only_videos_render_the_same_alone_as_in_one_batch(engine):
    requests = (RenderRequest(1, "a shoe on sand", None, 11, image=picture(3)),
                RenderRequest(2, "a blue square", "blurry", 12),
                RenderRequest(3, "a shoe on snow", None, 13, image=picture(4)))
    batched = engine.render(RenderBatch(SHAPE, requests))
    for request, video in zip(requests, batched):
        (alone,) = engine.render(RenderBatch(SHAPE, (request,)))
        assert close(alone.frames, video.frames), request.video_id


def test_pipeline_path_equals_one_diffusers_image_to_video_call(engine):
    """A batch of one through the engine's loop is WanImageToVideoPipeline.__call__ op for op."""
    pipe = engine.pipeline("tiny-i2v")
    image = picture(5)
    embeds, negative = engine._embeddings(I2V, engine.registry.get("tiny-i2v"), pipe,
                                          (RenderRequest(1, "a red circle", None, 7),))
    from PIL import Image

    with torch.inference_mode():
        ours = denoise_i2v(pipe, images=[image], prompt_embeds=embeds, negative_prompt_embeds=negative,
                           height=48, width=64, frames=9, steps=3, guidance=5.0,
                           generators=[torch.Generator().manual_seed(7)])
        theirs = pipe(image=Image.fromarray(image), prompt_embeds=embeds, negative_prompt_embeds=negative,
                      height=48, width=64, num_frames=9, num_inference_steps=3, guidance_scale=5.0,
                      generator=[torch.Generator().manual_seed(7)], output_type="latent").frames
    assert torch.equal(ours, theirs)


def test_pipeline_path_with_two_experts_equals_diffusers(model_cache):
    """Wan 2.2 I2V A14B's layout at toy widths: a high-noise and a low-noise transformer (no image encoder), the
    switch at boundary_ratio; the engine's loop picks the same expert at each step as the pipeline."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from PIL import Image

    from engine.models.tiny import build_tiny_pipeline

    base = build_tiny_pipeline()
    torch.manual_seed(3)
    experts = [WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                     in_channels=36, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64,
                                     num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                     rope_max_seq_len=256) for _ in range(2)]
    pipe = WanImageToVideoPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                                   scheduler=base.scheduler, transformer=experts[0], transformer_2=experts[1],
                                   boundary_ratio=0.5)
    pipe.set_progress_bar_config(disable=True)
    embeds = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(1))
    negative = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ours = denoise_i2v(pipe, images=[picture(6)], prompt_embeds=embeds, negative_prompt_embeds=negative,
                           height=48, width=64, frames=9, steps=4, guidance=4.0,
                           generators=[torch.Generator().manual_seed(9)])
        theirs = pipe(image=Image.fromarray(picture(6)), prompt_embeds=embeds, negative_prompt_embeds=negative,
                      height=48, width=64, num_frames=9, num_inference_steps=4, guidance_scale=4.0,
                      generator=[torch.Generator().manual_seed(9)], output_type="latent").frames
    assert torch.equal(ours, theirs)


def test_pipeline_path_batches_videos_with_their_own_pictures(engine):
    requests = tuple(RenderRequest(i, f"prompt {i}", None, 20 + i, image=picture(10 + i)) for i in range(3))
    batched = engine.render(RenderBatch(I2V, requests))
    for request, video in zip(requests, batched):
        (alone,) = engine.render(RenderBatch(I2V, (request,)))
        assert close(alone.frames, video.frames), request.video_id
    assert np.abs(batched[0].frames.astype(int) - batched[1].frames.astype(int)).mean() > 5


def test_a_long_video_starts_from_its_picture_and_ties_later_chunks_as_before(engine):
    chunk_plan = plan(49, 33, 2, 4)  # 13 latents in windows of 9 overlapping by 2: 2 chunks
    window = dataclasses.replace(SHAPE, frames=33, steps=2)
    request = RenderRequest(1, "a long walk", None, 31, image=picture(7))
    video, chunks = engine.render_long(window, request, chunk_plan)
    with torch.inference_mode():
        first = first_frame_latents(engine.pipeline("tiny"), picture(7))
    assert video.error is None and video.frames.shape == (49, 48, 64, 3)
    assert torch.equal(chunks[0][:, :1], first), "the picture starts the first chunk"
    assert torch.equal(chunks[1][:, :2], chunks[0][:, -2:]), "the next chunk is tied to the end of the first"
    assert not torch.allclose(chunks[1][:, :1], first, atol=0.1), "and does not start from the picture again"


def test_a_picture_for_a_model_that_takes_none_and_a_missing_one_are_refused(model_cache, engine):
    words = dataclasses.replace(TINY, name="words", image_condition=None, path=ensure_tiny(model_cache), builtin=False)
    tiny = engine
    registry = Registry({"words": words, "tiny-i2v": Registry().get("tiny-i2v")})
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    with pytest.raises(RenderError, match="model 'words' does not take images"):
        engine.render(RenderBatch(dataclasses.replace(SHAPE, model="words"),
                                  (RenderRequest(1, "x", None, 1, image=picture(1)),)))
    with pytest.raises(RenderError, match="model 'tiny-i2v' renders from an image: every video needs one"):
        engine.render(RenderBatch(I2V, (RenderRequest(1, "x", None, 1),)))
    with pytest.raises(RenderError, match=r"its image is uint8 \(32, 32, 3\), expected uint8 \(48, 64, 3\)"):
        tiny.render(RenderBatch(SHAPE, (RenderRequest(1, "x", None, 1, image=picture(1)[:32, :32]),)))
