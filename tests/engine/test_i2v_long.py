"""Long videos from a picture on the pipeline image path (`image_condition: pipeline`, issue 32), on Wan 2.1 I2V (the
built-in `tiny-i2v`: diffusers' classes with an image encoder) and Wan 2.2 I2V A14B (two experts, no image encoder,
saved like a downloaded folder): the first chunk from the picture as a short video, each later chunk conditioned
through the pipeline's mask and picture channels on the chunk before's last frames (engine.loop.i2v), stitched and
decoded once."""

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.long.chunks import plan
from engine.loop.i2v import continuation_latents
from engine.models.file import load_registry
from engine.models.registry import Registry
from engine.types import RenderBatch, RenderRequest, Shape

from .wan22 import build_i2v_a14b

# 17 frames a window (5 latents), 2 latents shared: 41 frames are 11 latents, 5 + 3 + 3 in three chunks.
WINDOW = 17
CHUNK_PLAN = plan(41, WINDOW, 2, 4)


def picture(seed: int) -> np.ndarray:
    cells = np.random.default_rng(seed).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return np.repeat(np.repeat(cells, 8, axis=0), 8, axis=1)


@pytest.fixture(scope="module")
def engines(model_cache, tmp_path_factory):
    """The built-in Wan 2.1 I2V at toy widths, and a Wan 2.2 I2V A14B folder registered through a models file."""
    folder = tmp_path_factory.mktemp("i2v-a14b") / "Wan2.2-I2V-A14B-tiny"
    build_i2v_a14b().save_pretrained(folder, safe_serialization=True)
    models = folder.parent / "models.yaml"
    models.write_text(f"i2v-a14b:\n  path: {folder}\n  max_sequence_length: 64\n  image_condition: pipeline\n")
    return {"tiny-i2v": Engine(EngineConfig(cache_dir=model_cache), Registry()),
            "i2v-a14b": Engine(EngineConfig(cache_dir=model_cache), load_registry(models))}


@pytest.mark.parametrize("model", ["tiny-i2v", "i2v-a14b"])
def test_a_long_video_from_a_picture_renders_in_chunks_its_first_the_short_video(engines, model):
    engine = engines[model]
    window = Shape(model, 32, 32, WINDOW, 2, 4.0)
    request = RenderRequest(1, "a long walk", None, 31, image=picture(1))
    masks = []  # the mask channels (16..19 of the 36 the transformer reads) of each call's first latent row
    hook = engine.pipeline(model).transformer.register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs["hidden_states"][0, 16:20, :, 0, 0].clone()),
        with_kwargs=True)
    try:
        video, chunks = engine.render_long(window, request, CHUNK_PLAN)
    finally:
        hook.remove()
    assert video.error is None and len(chunks) == 3
    assert video.frames.shape == (41, 32, 32, 3)
    assert all(c.shape == (16, 5, 4, 4) for c in chunks)
    # The first chunk is the short video of the same picture and seed.
    (short,) = engine.render(RenderBatch(window, (dataclasses.replace(request, latents_only=True),)))
    assert torch.equal(chunks[0], short.latents)
    # What the transformer reads: the picture's mask (its frame 0, folded over the first latent's four rows), then
    # each later chunk's over the 1 + 4 = 5 frames decoded from the 2 shared latents, i.e. its first two latents.
    first, later = torch.tensor([1.0, 0, 0, 0, 0]), torch.tensor([1.0, 1, 0, 0, 0])
    per_chunk = len(masks) // 3
    for k, expected in enumerate((first, later, later)):
        for mask in masks[k * per_chunk : (k + 1) * per_chunk]:
            assert torch.equal(mask, expected.expand(4, 5)), k
    assert not torch.equal(chunks[1], chunks[2])


def test_a_continuation_from_one_frame_is_the_pipelines_own_conditioning_on_that_picture(engines):
    """engine.loop.i2v.continuation_latents, given a single known frame, builds what
    WanImageToVideoPipeline.prepare_latents builds for that frame as the picture: the same noise, mask and encoded
    condition, bit for bit."""
    pipe = engines["tiny-i2v"].pipeline("tiny-i2v")
    with torch.inference_mode():
        ours = continuation_latents(pipe, picture(2)[None], 32, 32, 17, torch.Generator().manual_seed(4))
        pixels = pipe.video_processor.preprocess(Image.fromarray(picture(2)), height=32, width=32)
        theirs = pipe.prepare_latents(pixels, 1, 16, 32, 32, 17, torch.float32, pipe._execution_device,
                                      [torch.Generator().manual_seed(4)])
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
