"""The operator's models file: names mapped to local diffusers folders, loaded with safetensors only."""

import re
import shutil
import weakref

import numpy as np
import pytest
import torch
from diffusers import WanTransformer3DModel

from engine.engine import Engine
from engine.errors import ModelNotFound
from engine.levers.config import EngineConfig
from engine.levers.text_cache import TEXT_PARTS
from engine.models.file import load_registry
from engine.models.registry import builtin_models
from engine.models.tiny import ensure_builtin, ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape


def test_a_registered_folder_loads_and_renders_like_the_builtin(model_cache, tmp_path):
    folder = tmp_path / "my-wan"
    shutil.copytree(ensure_tiny(model_cache), folder)
    models = tmp_path / "models.yaml"
    models.write_text(f"my-wan:\n  path: {folder}\n  defaults: {{width: 32, height: 32, fps: 4, steps: 2}}\n"
                      "  max_frames: 17\n  max_sequence_length: 64\n  chunk_condition: clean\n"
                      f"other:\n  path: {folder}\n")
    registry = load_registry(models)
    info = registry.get("my-wan")
    assert info.path == folder and info.defaults.width == 32 and info.defaults.guidance == 5.0
    assert info.max_frames == 17 and not info.builtin and info.chunk_condition == "clean"
    assert registry.get("other").chunk_condition == "noised", "a model not trained to continue a clean prefix"
    assert registry.names() == sorted(["my-wan", "other", *builtin_models()])

    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    request = (RenderRequest(1, "a red circle", None, 3),)
    mine = engine.render(RenderBatch(Shape("my-wan", 32, 32, 5, 2, 5.0), request))
    builtin = engine.render(RenderBatch(Shape("tiny", 32, 32, 5, 2, 5.0), request))
    assert mine[0].frames.shape == (5, 32, 32, 3)
    assert np.array_equal(mine[0].frames, builtin[0].frames), "same weights, same seed: same video"


@pytest.mark.parametrize("entry,message", [
    ("bad: {}\n", "needs a 'path'"),
    ("bad: {path: /nonexistent/folder}\n", "holds no model_index.json"),
    ("- just a list\n", "expected a mapping"),
])
def test_models_file_errors_name_the_problem(tmp_path, entry, message):
    models = tmp_path / "models.yaml"
    models.write_text(entry)
    with pytest.raises(ModelNotFound, match=message):
        load_registry(models)


def test_unknown_model_defaults_are_refused(model_cache, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"m:\n  path: {ensure_tiny(model_cache)}\n  defaults: {{widht: 32}}\n")
    with pytest.raises(ModelNotFound, match=r"models.yaml:3: model 'm': defaults: unknown key 'widht' "
                                            r"\(did you mean 'width'\?\)"):
        load_registry(models)


def test_an_unknown_chunk_condition_is_refused(model_cache, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"m:\n  path: {ensure_tiny(model_cache)}\n  chunk_condition: sharp\n")
    with pytest.raises(ModelNotFound, match=r"model 'm': chunk_condition must be one of noised, clean, got 'sharp'"):
        load_registry(models)


def test_a_registration_may_cap_its_batch(model_cache, tmp_path):
    models = tmp_path / "models.yaml"
    folder = ensure_tiny(model_cache)
    models.write_text(f"big:\n  path: {folder}\n  max_batch: 2\nsmall:\n  path: {folder}\n")
    registry = load_registry(models)
    assert registry.get("big").max_batch == 2 and registry.get("small").max_batch is None


@pytest.mark.parametrize("entry,message", [
    ("  max_batch: 0\n", r"model 'm': max_batch must be a whole number of at least 1, got 0"),
    ("  max_batch: 2.5\n", r"model 'm': max_batch must be a whole number of at least 1, got 2.5"),
])
def test_a_bad_max_batch_is_refused(model_cache, tmp_path, entry, message):
    models = tmp_path / "models.yaml"
    models.write_text(f"m:\n  path: {ensure_tiny(model_cache)}\n{entry}")
    with pytest.raises(ModelNotFound, match=message):
        load_registry(models)


def test_a_model_name_that_cannot_name_a_queue_is_refused(model_cache, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"'wan 14b,fast':\n  path: {ensure_tiny(model_cache)}\n")
    with pytest.raises(ModelNotFound, match=r"model 'wan 14b,fast': a name has letters, digits"):
        load_registry(models)


def test_at_most_max_models_pipelines_stay_loaded_least_recently_used_leaves(model_cache, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"other:\n  path: {ensure_tiny(model_cache)}\n")
    registry = load_registry(models)
    request = (RenderRequest(1, "a red circle moving left on a black background", None, 3),)

    def render(engine, model, frames):
        engine.render(RenderBatch(Shape(model, 32, 32, frames, 1, 1.0), request))

    one = Engine(EngineConfig(cache_dir=model_cache, max_models=1), registry)
    render(one, "tiny", 5)
    tiny = weakref.ref(one.pipeline("tiny"))
    render(one, "toy", 9)
    assert one.loaded() == ("toy",)
    assert tiny() is None, "the unloaded pipeline is freed, not merely forgotten"
    assert one.last_shape == Shape("toy", 32, 32, 9, 1, 1.0)

    two = Engine(EngineConfig(cache_dir=model_cache, max_models=2), registry)
    for model, frames in [("tiny", 5), ("toy", 9), ("tiny", 5)]:
        render(two, model, frames)
    assert two.loaded() == ("toy", "tiny"), "least recently used first"
    render(two, "other", 5)
    assert two.loaded() == ("tiny", "other"), "toy was used least recently, so toy left"
def test_image_registrations_are_read_and_bad_values_refused(model_cache, tmp_path):
    folder = ensure_tiny(model_cache)
    models = tmp_path / "models.yaml"
    models.write_text(f"i2v:\n  path: {ensure_builtin(model_cache, 'tiny-i2v')}\n  image_condition: pipeline\n"
                      f"ti2v:\n  path: {folder}\n  image_condition: first_frame\n  mixed_image_batches: false\n"
                      f"t2v:\n  path: {folder}\n")
    registry = load_registry(models)
    assert (registry.get("i2v").image_condition, registry.get("i2v").mixed_image_batches) == ("pipeline", True)
    assert (registry.get("ti2v").image_condition, registry.get("ti2v").mixed_image_batches) == ("first_frame", False)
    assert registry.get("t2v").image_condition is None
    for entry, message in ((f"m:\n  path: {folder}\n  image_condition: last_frame\n",
                            "model 'm': image_condition must be one of first_frame, pipeline (or left out: no "
                            "images), got 'last_frame'"),
                           (f"m:\n  path: {folder}\n  image_condition: pipeline\n",
                            "model 'm': image_condition: pipeline needs a WanImageToVideoPipeline folder; "
                            f"{folder / 'model_index.json'} names WanPipeline"),
                           (f"m:\n  path: {ensure_builtin(model_cache, 'tiny-i2v')}\n",
                            f"model 'm': {ensure_builtin(model_cache, 'tiny-i2v') / 'model_index.json'} names "
                            "WanImageToVideoPipeline, whose transformer reads a picture's mask and latents beside the "
                            "video's: register it with image_condition: pipeline, got None"),
                           (f"m:\n  path: {folder}\n  mixed_image_batches: sometimes\n",
                            "model 'm': mixed_image_batches must be true or false, got 'sometimes'"),
                           (f"m:\n  path: {tmp_path}\n  base: {tmp_path / 'nothing'}\n",
                            f"model 'm': {tmp_path / 'nothing'} holds no model_index.json")):
        models.write_text(entry)
        with pytest.raises(ModelNotFound, match=re.escape(message)):
            load_registry(models)


def test_a_fine_tune_ships_only_the_parts_it_changed_over_a_base(model_cache, tmp_path):
    """A folder holding only transformer/ over `base`: the pipeline is the base's with that transformer. Here the
    transformer is tiny's own, so the video is tiny's; then a changed transformer changes it."""
    base = ensure_tiny(model_cache)
    folder = tmp_path / "fine-tune"
    shutil.copytree(base / "transformer", folder / "transformer")
    models = tmp_path / "models.yaml"
    models.write_text(f"ft:\n  path: {folder}\n  base: {base}\n  max_sequence_length: 64\n")
    registry = load_registry(models)
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    request = (RenderRequest(1, "a red circle", None, 3),)
    mine = engine.render(RenderBatch(Shape("ft", 32, 32, 5, 2, 5.0), request))
    builtin = engine.render(RenderBatch(Shape("tiny", 32, 32, 5, 2, 5.0), request))
    assert np.array_equal(mine[0].frames, builtin[0].frames)
    assert engine.identity(registry.get("ft"), TEXT_PARTS) != engine.identity(registry.get("tiny"), TEXT_PARTS)

    changed = WanTransformer3DModel.from_pretrained(folder / "transformer")
    with torch.no_grad():
        changed.proj_out.bias.add_(0.5)
    changed.save_pretrained(folder / "transformer", safe_serialization=True)
    other = Engine(EngineConfig(cache_dir=model_cache), load_registry(models))
    assert not np.array_equal(other.render(RenderBatch(Shape("ft", 32, 32, 5, 2, 5.0), request))[0].frames,
                              builtin[0].frames)
