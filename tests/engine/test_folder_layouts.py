"""Every Wan folder layout diffusers loads (issue 32), built at tiny widths with diffusers' own classes and
`save_pretrained`, registered through a models file as an operator registers a downloaded folder, and rendered:
WanPipeline (Wan 2.1 T2V, Wan 2.2 T2V A14B, Wan 2.2 TI2V) and WanImageToVideoPipeline (Wan 2.1 I2V with its image
encoder, Wan 2.2 I2V A14B with two experts and none), with fp32, bf16 and fp16 files, sharded with an index or
whole."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.engine import Engine
from engine.errors import ModelNotFound
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.models.registration import read_header
from engine.models.tiny import (
    build_tiny_a14b_pipeline,
    build_tiny_i2v_pipeline,
    build_tiny_pipeline,
    build_tiny_ti2v_pipeline,
)
from engine.types import RenderBatch, RenderRequest, Shape

from .wan22 import build_i2v_a14b


def in_dtype(build, dtype):
    """The pipeline with its transformers and text encoder stored in `dtype`, as Wan folders are published (bf16
    transformers, the VAE in fp32)."""
    def made():
        pipe = build()
        for name in ("transformer", "transformer_2", "text_encoder"):
            if getattr(pipe, name, None) is not None:
                getattr(pipe, name).to(dtype)
        return pipe
    return made


# name -> (builder, save_pretrained's max_shard_size or None, image_condition, the shape rendered)
LAYOUTS = {
    "wan21-t2v": (build_tiny_pipeline, None, None, (32, 32)),
    "wan21-t2v-bf16-sharded": (in_dtype(build_tiny_pipeline, torch.bfloat16), "40KB", None, (32, 32)),
    "wan21-t2v-fp16": (in_dtype(build_tiny_pipeline, torch.float16), None, None, (32, 32)),
    "wan22-t2v-a14b-bf16-sharded": (in_dtype(build_tiny_a14b_pipeline, torch.bfloat16), "40KB", None, (32, 32)),
    "wan22-ti2v": (build_tiny_ti2v_pipeline, None, None, (64, 64)),
    "wan21-i2v": (build_tiny_i2v_pipeline, None, "pipeline", (32, 32)),
    "wan21-i2v-fp16-sharded": (in_dtype(build_tiny_i2v_pipeline, torch.float16), "40KB", "pipeline", (32, 32)),
    "wan22-i2v-a14b-bf16": (in_dtype(build_i2v_a14b, torch.bfloat16), None, "pipeline", (32, 32)),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    out = {}
    for name, (build, shard, _, _) in LAYOUTS.items():
        options = {} if shard is None else {"max_shard_size": shard}
        build().save_pretrained(root / name, safe_serialization=True, **options)
        out[name] = root / name
    return out


def register(tmp_path, name, folder, image_condition):
    models = tmp_path / "models.yaml"
    extra = f"  image_condition: {image_condition}\n" if image_condition else ""
    models.write_text(f"{name}:\n  path: {folder}\n  max_sequence_length: 64\n{extra}")
    return load_registry(models)


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_layout_registers_and_renders(folders, model_cache, tmp_path, name):
    _, shard, image_condition, (width, height) = LAYOUTS[name]
    folder = folders[name]
    registry = register(tmp_path, name, folder, image_condition)
    if shard is not None:  # really sharded: an index and several shards for the transformer
        assert (folder / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
        assert len(list((folder / "transformer").glob("diffusion_pytorch_model-*.safetensors"))) >= 2
    image = np.full((height, width, 3), 90, dtype=np.uint8) if image_condition else None
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    # Two steps at guidance 2 (the guided path): on an A14B layout one step on each expert.
    (video,) = engine.render(RenderBatch(Shape(name, width, height, 5, 2, 2.0),
                                         (RenderRequest(1, "a red circle", "blurry", 3, image=image),)))
    assert video.error is None and video.frames.shape == (5, height, width, 3)


@pytest.mark.parametrize("name, stored", [("wan21-t2v-bf16-sharded", "BF16"), ("wan21-t2v-fp16", "F16")])
def test_half_precision_files_load_with_the_files_values(folders, model_cache, tmp_path, name, stored):
    """The stored tensors are half precision; loaded at the engine's dtype (fp32 here) they hold the file's values
    exactly (a widening cast)."""
    folder = folders[name]
    shards = sorted((folder / "transformer").glob("*.safetensors"))
    assert {info["dtype"] for shard in shards for info in read_header(shard).values()} == {stored}
    engine = Engine(EngineConfig(cache_dir=model_cache), register(tmp_path, name, folder, None))
    loaded = engine.pipeline(name).transformer.state_dict()
    for shard in shards:
        for key, value in load_file(shard).items():
            assert loaded[key].dtype == torch.float32
            assert torch.equal(loaded[key], value.float()), key


def test_two_expert_image_folder_is_the_a14b_family(folders, tmp_path):
    info = register(tmp_path, "i2v", folders["wan22-i2v-a14b-bf16"], "pipeline").get("i2v")
    assert (info.family, info.boundary_ratio, info.image_condition) == ("wan2.2-a14b", 0.9, "pipeline")


def test_an_image_folder_without_its_image_encoder_is_refused_naming_the_file(folders, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(folders["wan21-i2v"], folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "image_encoder": [None, None]}))
    with pytest.raises(ModelNotFound, match=rf"model 'b': {folder}/model_index\.json: image_encoder is \[None, None\], "
                                            rf"but {folder}/transformer/config\.json has image_dim 16: the picture is "
                                            "encoded with the image encoder and its processor"):
        register(tmp_path, "b", folder, "pipeline")
