"""Registering Wan 2.2 folders: the family, frame rule, sizes and defaults come from the folder's own files; a
registration that could not render fails at load, naming the file and the key."""

import json
import re
import shutil

import pytest

from engine.errors import ModelNotFound
from engine.models.file import load_registry
from engine.models.tiny import ensure_tiny_a14b, ensure_tiny_ti2v

from .wan22 import A14B, TI2V


def test_each_family_gets_its_published_defaults_and_frame_rules(wan22):
    a14b, ti2v, wan21 = wan22.get(A14B), wan22.get(TI2V), wan22.get("wan21")
    assert (a14b.family, ti2v.family, wan21.family) == ("wan2.2-a14b", "wan2.2-ti2v", "wan2.1")
    # T2V-A14B: 1280x720 at 16 fps, 81 frames, 40 steps, guidance 4.0 (high noise) and 3.0 (low noise), switch at
    # 0.875; the Wan 2.1 VAE (8x) and 2x2 patches: sides in 16s.
    d = a14b.defaults
    assert (d.width, d.height, d.fps, d.duration_s, d.steps, d.guidance) == (1280, 720, 16, 5.0, 40, 4.0)
    assert (a14b.guidance_2, a14b.boundary_ratio, a14b.max_frames) == (3.0, 0.875, 81)
    assert (a14b.temporal_factor, a14b.spatial_multiple, a14b.offload_idle_expert) == (4, 16, False)
    # TI2V-5B: 1280x704 at 24 fps, 121 frames (5 s), 50 steps, guidance 5.0; the Wan 2.2 VAE (16x) and 2x2
    # patches: sides in 32s.
    d = ti2v.defaults
    assert (d.width, d.height, d.fps, d.duration_s, d.steps, d.guidance) == (1280, 704, 24, 5.0, 50, 5.0)
    assert (ti2v.guidance_2, ti2v.boundary_ratio, ti2v.max_frames) == (None, None, 121)
    assert (ti2v.temporal_factor, ti2v.spatial_multiple) == (4, 32)
    assert (wan21.defaults.width, wan21.max_frames, wan21.spatial_multiple) == (832, 81, 16)
    # 5 s at 24 fps is 121 frames: one window. 10 s is 241 frames, 61 latents: windows of 31 overlapping by 2,
    # 1 + ceil(30 / 29) = 3 chunks.
    assert ti2v.valid_frames(120) == 121 and ti2v.chunk_plan(121).chunks == 1
    assert ti2v.chunk_plan(241).chunks == 3 and a14b.chunk_plan(161).chunks == 3


def test_a_models_file_overrides_defaults_and_may_coarsen_the_grid(model_cache, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"a:\n  path: {ensure_tiny_a14b(model_cache)}\n  defaults: {{width: 832, height: 480}}\n"
                      "  guidance_2: 2.5\n  boundary_ratio: 0.875\n  offload_idle_expert: true\n"
                      f"t:\n  path: {ensure_tiny_ti2v(model_cache)}\n  spatial_multiple: 64\n  temporal_factor: 4\n")
    registry = load_registry(models)
    a, t = registry.get("a"), registry.get("t")
    assert (a.defaults.width, a.defaults.height, a.defaults.steps, a.guidance_2, a.offload_idle_expert) == \
        (832, 480, 40, 2.5, True)
    assert t.spatial_multiple == 64


def copy_of(folder, tmp_path):
    copy = tmp_path / "folder"
    shutil.copytree(folder, copy)
    return copy


def edit_index(folder, **changes):
    index = folder / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), **changes}))


@pytest.mark.parametrize("damage, message", [
    (lambda f: [p.unlink() for p in (f / "transformer_2").glob("*.safetensors")],
     r"model_index.json names transformer_2 \(WanTransformer3DModel\) but .*/transformer_2 holds no .safetensors"),
    (lambda f: shutil.rmtree(f / "transformer_2"),
     r"names transformer_2 \(WanTransformer3DModel\) but .*/transformer_2/config.json is missing"),
    (lambda f: edit_index(f, transformer_2=[None, None]),
     r"model_index.json: boundary_ratio 0.875 switches to transformer_2, which is null"),
    (lambda f: edit_index(f, boundary_ratio=1.5), r"boundary_ratio must be a number between 0 and 1, got 1.5"),
    (lambda f: edit_index(f, _class_name="LTXPipeline"),
     r"_class_name is 'LTXPipeline'; reelbatch renders folders of WanPipeline and WanImageToVideoPipeline"),
    # A text-to-video transformer under the image-to-video class: it would not take the mask and picture channels.
    (lambda f: edit_index(f, _class_name="WanImageToVideoPipeline"),
     r"transformer/config.json: in_channels is 16, but WanImageToVideoPipeline feeds it 36 \(16 latent \+ 4 mask "
     r"\+ 16 picture channels\)"),
    (lambda f: [p.rename(p.with_name("diffusion_pytorch_model.fp16.safetensors"))
                for p in (f / "transformer").glob("*.safetensors")],
     r"/transformer holds only variant weight files \(diffusion_pytorch_model.fp16.safetensors\); reelbatch loads "
     r"plain names"),
])
def test_a_folder_that_could_not_render_fails_at_load(model_cache, tmp_path, damage, message):
    folder = copy_of(ensure_tiny_a14b(model_cache), tmp_path)
    damage(folder)
    models = tmp_path / "models.yaml"
    models.write_text(f"a:\n  path: {folder}\n")
    with pytest.raises(ModelNotFound, match=f"{re.escape(str(models))}: model 'a': .*{message}"):
        load_registry(models)


@pytest.mark.parametrize("folder, line, message", [
    ("ti2v", "guidance_2: 3.0", "guidance_2 is for two-expert folders; its model_index.json has no boundary_ratio"),
    ("ti2v", "spatial_multiple: 16",
     "spatial_multiple 16 must be a multiple of 32 \\(the VAE's scale_factor_spatial x the transformer's patch"),
    ("ti2v", "temporal_factor: 2", "temporal_factor 2, but its VAE compresses time by 4"),
    ("a14b", "boundary_ratio: 0.9", "boundary_ratio 0.9, but its model_index.json has 0.875"),
    ("a14b", "guidance_2: 50", "guidance_2 must be a number from 0 to 30, got 50"),
    ("a14b", "offload_idle_expert: sometimes", "offload_idle_expert must be true or false, got 'sometimes'"),
])
def test_registration_values_that_do_not_fit_the_folder_are_refused(model_cache, tmp_path, folder, line, message):
    path = {"a14b": ensure_tiny_a14b, "ti2v": ensure_tiny_ti2v}[folder](model_cache)
    models = tmp_path / "models.yaml"
    models.write_text(f"m:\n  path: {path}\n  {line}\n")
    with pytest.raises(ModelNotFound, match=f"{re.escape(str(models))}: model 'm': {message}"):
        load_registry(models)
