"""Adapter files in the layouts Wan LoRAs are published in (issue 32), read through diffusers' own conversion
(engine.adapters.files), registered through a models file, fused and rendered on the tiny-width builds
(engine.models.tiny).

Tensor names are the ones diffusers' converters read (diffusers/loaders/lora_conversion_utils.py:
`_convert_non_diffusers_wan_lora_to_diffusers` for `diffusion_model.*`, `_convert_musubi_wan_lora_to_diffusers` for
`lora_unet_*`). For each layout one layer's fused weight is checked against numbers worked out by hand: W + scale x
(alpha / rank) x B @ A, on its top-left 2x2 block, the rest of the layer unchanged."""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine.adapters.files import AdapterRefused
from engine.engine import Engine
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.models.tiny import ensure_builtin, ensure_tiny, ensure_tiny_a14b
from engine.types import RenderBatch, RenderRequest, Shape

WIDTH = 32  # the tiny transformers' attention width (2 heads x 16) and text width
FFN = 64


def down(rows, width=WIDTH):
    """A (rank x width) matrix whose first columns are `rows` and the rest 0."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def up(rows, width=WIDTH):
    """A (width x rank) matrix whose first rows are `rows` and the rest 0."""
    out = torch.zeros(width, len(rows[0]))
    out[: len(rows)] = torch.tensor(rows, dtype=torch.float32)
    return out


# The worked example shared by the layouts: rank 2, A = [[1, 2], [0, 1]], B = [[2, 0], [0, 4]] (top-left blocks, the
# rest 0), so B @ A = [[2, 4], [0, 4]]. With alpha 1 (alpha / rank = 0.5) at scale 3: x 1.5 = [[3, 6], [0, 6]].
A2, B2 = down([[1, 2], [0, 1]]), up([[2, 0], [0, 4]])
EXPECTED_ALPHA1_SCALE3 = [[3.0, 6.0], [0.0, 6.0]]


def transformer_weights(folder, component="transformer"):
    from diffusers import WanTransformer3DModel

    return dict(WanTransformer3DModel.from_pretrained(folder / component).state_dict())


def register(tmp_path, text):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return load_registry(path)


def render(engine, name, image=None):
    request = RenderRequest(1, "a red circle", None, 5, image=image)
    (video,) = engine.render(RenderBatch(Shape(name, 32, 32, 5, 2, 1.0), (request,)))
    assert video.error is None and video.frames.shape == (5, 32, 32, 3)


def assert_delta(fused, base, name, block):
    """The fused layer minus its base: `block` on the top-left 2x2, zero elsewhere."""
    delta = fused[name] - base[name]
    torch.testing.assert_close(delta[:2, :2], torch.tensor(block), rtol=0, atol=1e-6)
    delta[:2, :2] = 0
    assert delta.abs().max() < 1e-6, name


@pytest.fixture(scope="module")
def tiny(model_cache):
    return ensure_tiny(model_cache)


@pytest.fixture(scope="module")
def tiny_i2v(model_cache):
    return ensure_builtin(model_cache, "tiny-i2v")


def test_original_wan_layout_with_alphas_and_image_attention(tiny_i2v, model_cache, tmp_path):
    """ComfyUI / original Wan names on the image-to-video transformer: lora_down / lora_up with `.alpha`, the
    image-attention `k_img` / `v_img` pair, a feed-forward layer with a `.diff_b` bias. Every tensor is applied:
    cross_attn.k_img (rank 1, alpha 2 so alpha / rank = 2, at scale 3: x 6) and self_attn.q (the shared example)."""
    p = "diffusion_model.blocks.0"
    tensors = {
        f"{p}.self_attn.q.lora_down.weight": A2, f"{p}.self_attn.q.lora_up.weight": B2,
        f"{p}.self_attn.q.alpha": torch.tensor(1.0),
        # B @ A = [[1, -1], [2, -2]]; x 2 x 3 = [[6, -6], [12, -12]]
        f"{p}.cross_attn.k_img.lora_down.weight": down([[1, -1]]),
        f"{p}.cross_attn.k_img.lora_up.weight": up([[1], [2]]),
        f"{p}.cross_attn.k_img.alpha": torch.tensor(2.0),
        f"{p}.cross_attn.v_img.lora_down.weight": down([[1]]), f"{p}.cross_attn.v_img.lora_up.weight": up([[1]]),
        f"{p}.cross_attn.v_img.alpha": torch.tensor(1.0),
        f"{p}.ffn.0.lora_down.weight": down([[1]]), f"{p}.ffn.0.lora_up.weight": up([[1]], FFN),
        f"{p}.ffn.0.alpha": torch.tensor(1.0), f"{p}.ffn.0.diff_b": torch.full((FFN,), 0.25),
    }
    save_file(tensors, tmp_path / "comfy.safetensors")
    registry = register(tmp_path, f"i2v-lora:\n  path: {tiny_i2v}\n  max_sequence_length: 64\n  image_condition: "
                                  f"pipeline\n  adapters: [{{path: {tmp_path / 'comfy.safetensors'}, scale: 3}}]\n")
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    base = transformer_weights(tiny_i2v)
    fused = dict(engine.pipeline("i2v-lora").transformer.state_dict())
    assert set(fused) == set(base)
    assert_delta(fused, base, "blocks.0.attn1.to_q.weight", EXPECTED_ALPHA1_SCALE3)
    assert_delta(fused, base, "blocks.0.attn2.add_k_proj.weight", [[6.0, -6.0], [12.0, -12.0]])
    assert_delta(fused, base, "blocks.0.attn2.add_v_proj.weight", [[3.0, 0.0], [0.0, 0.0]])
    # diff_b is a bias added at the adapter's scale: 3 x 0.25 on every output.
    torch.testing.assert_close(fused["blocks.0.ffn.net.0.proj.bias"] - base["blocks.0.ffn.net.0.proj.bias"],
                               torch.full((FFN,), 0.75), rtol=0, atol=1e-6)
    render(engine, "i2v-lora", image=np.full((32, 32, 3), 128, dtype=np.uint8))


def test_lightx2v_style_layout_with_a_head_diff_and_zero_norm_diffs(tiny, model_cache, tmp_path):
    """`diffusion_model.*` with lora_A / lora_B and no alphas (alpha / rank = 1), as the step-distilled Wan LoRAs
    are published: a full-weight `head.head.diff` with its `diff_b` (diffusers applies it through an identity B), and
    norm-layer `.diff` keys of zeros, which diffusers drops (dropping zeros changes nothing, so the file loads)."""
    p = "diffusion_model.blocks.0"
    head_diff = torch.zeros(64, WIDTH)  # proj_out: 32 -> 16 channels x 2 x 2 patch
    head_diff[:2, :2] = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    tensors = {
        # B @ A = [[2, 4], [0, 4]], alpha / rank 1, at scale 0.5: [[1, 2], [0, 2]]
        f"{p}.cross_attn.k.lora_A.weight": A2, f"{p}.cross_attn.k.lora_B.weight": B2,
        "diffusion_model.head.head.diff": head_diff, "diffusion_model.head.head.diff_b": torch.zeros(64),
        f"{p}.norm3.diff": torch.zeros(WIDTH), f"{p}.norm3.diff_b": torch.zeros(WIDTH),
    }
    save_file(tensors, tmp_path / "distill.safetensors")
    registry = register(tmp_path, f"fast:\n  path: {tiny}\n  max_sequence_length: 64\n"
                                  f"  adapters: [{{path: {tmp_path / 'distill.safetensors'}, scale: 0.5}}]\n")
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    base = transformer_weights(tiny)
    fused = dict(engine.pipeline("fast").transformer.state_dict())
    assert_delta(fused, base, "blocks.0.attn2.to_k.weight", [[1.0, 2.0], [0.0, 2.0]])
    # The head's diff at the adapter's scale: 0.5 x [[0.5, -1], [2, 0.25]].
    assert_delta(fused, base, "proj_out.weight", [[0.25, -0.5], [1.0, 0.125]])
    render(engine, "fast")


def musubi_file(path, rank_one_q=None):
    """Every module musubi-tuner's converter reads for the tiny transformer's two blocks (it pops each one, with its
    alpha), all zeros but `rank_one_q`, block 0's self_attn.q."""
    tensors = {}
    for i in range(2):
        for module in ("self_attn_q", "self_attn_k", "self_attn_v", "self_attn_o", "cross_attn_q", "cross_attn_k",
                       "cross_attn_v", "cross_attn_o", "ffn_0", "ffn_2"):
            out_width = FFN if module == "ffn_0" else WIDTH
            in_width = FFN if module == "ffn_2" else WIDTH
            key = f"lora_unet_blocks_{i}_{module}"
            tensors[f"{key}.lora_down.weight"] = torch.zeros(1, in_width)
            tensors[f"{key}.lora_up.weight"] = torch.zeros(out_width, 1)
            tensors[f"{key}.alpha"] = torch.tensor(1.0)
    if rank_one_q is not None:
        a, b, alpha = rank_one_q
        tensors["lora_unet_blocks_0_self_attn_q.lora_down.weight"] = a
        tensors["lora_unet_blocks_0_self_attn_q.lora_up.weight"] = b
        tensors["lora_unet_blocks_0_self_attn_q.alpha"] = torch.tensor(alpha)
    save_file(tensors, path)


def test_musubi_kohya_layout(tiny, model_cache, tmp_path):
    """`lora_unet_blocks_N_*` (musubi-tuner) with alphas: rank 1, A = [1, -2], B = [3, 1], alpha 2 (alpha / rank =
    2), scale 0.5: B @ A = [[3, -6], [1, -2]], x 1 = the same."""
    musubi_file(tmp_path / "musubi.safetensors", (down([[1, -2]]), up([[3], [1]]), 2.0))
    registry = register(tmp_path, f"kohya:\n  path: {tiny}\n  max_sequence_length: 64\n"
                                  f"  adapters: [{{path: {tmp_path / 'musubi.safetensors'}, scale: 0.5}}]\n")
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    base = transformer_weights(tiny)
    fused = dict(engine.pipeline("kohya").transformer.state_dict())
    assert_delta(fused, base, "blocks.0.attn1.to_q.weight", [[3.0, -6.0], [1.0, -2.0]])
    assert_delta(fused, base, "blocks.1.attn1.to_q.weight", [[0.0, 0.0], [0.0, 0.0]])
    render(engine, "kohya")


def test_a_wan22_pair_in_the_original_layout_goes_to_each_expert(model_cache, tmp_path):
    """A high-noise / low-noise pair as Wan 2.2 few-step LoRAs are published (`diffusion_model.*` names in both
    files): each fused into its own expert at its own scale; the other expert's layer unchanged."""
    a14b = ensure_tiny_a14b(model_cache)
    p = "diffusion_model.blocks.1.self_attn.o"
    save_file({f"{p}.lora_down.weight": A2, f"{p}.lora_up.weight": B2, f"{p}.alpha": torch.tensor(1.0)},
              tmp_path / "high.safetensors")
    # B @ A = [[1, 1], [1, 1]], alpha 4 on rank 1 (x 4), scale 0.25: x 1.
    save_file({f"{p}.lora_down.weight": down([[1, 1]]), f"{p}.lora_up.weight": up([[1], [1]]),
               f"{p}.alpha": torch.tensor(4.0)}, tmp_path / "low.safetensors")
    registry = register(tmp_path, f"pair:\n  path: {a14b}\n  max_sequence_length: 64\n  adapters:\n"
                                  f"    - {{path: {tmp_path / 'high.safetensors'}, scale: 3, expert: high_noise}}\n"
                                  f"    - {{path: {tmp_path / 'low.safetensors'}, scale: 0.25, expert: low_noise}}\n")
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    pipe = engine.pipeline("pair")
    name = "blocks.1.attn1.to_out.0.weight"
    assert_delta(dict(pipe.transformer.state_dict()), transformer_weights(a14b), name, EXPECTED_ALPHA1_SCALE3)
    assert_delta(dict(pipe.transformer_2.state_dict()), transformer_weights(a14b, "transformer_2"), name,
                 [[1.0, 1.0], [1.0, 1.0]])
    (video,) = engine.render(RenderBatch(Shape("pair", 32, 32, 5, 4, 1.0), (RenderRequest(1, "a", None, 5),)))
    assert video.error is None


@pytest.mark.parametrize("extra, message", [
    # A full-weight diff of a linear layer: diffusers' converter logs that it does not handle it and drops it.
    ({"diffusion_model.blocks.0.self_attn.q.diff": torch.ones(WIDTH, WIDTH)},
     r"diffusers' Wan LoRA conversion would drop 1 tensor\(s\) holding non-zero values: "
     r"'diffusion_model\.blocks\.0\.self_attn\.q\.diff'"),
    # A norm layer's diff that is not zero: dropped on purpose by the converter, so not applied.
    ({"diffusion_model.blocks.0.norm3.diff": torch.ones(WIDTH)},
     r"diffusers' Wan LoRA conversion would drop 1 tensor\(s\) holding non-zero values: "
     r"'diffusion_model\.blocks\.0\.norm3\.diff'"),
    # An image-attention key without its pair: the converter leaves it over and raises.
    ({"diffusion_model.blocks.0.cross_attn.k_img.lora_down.weight": torch.ones(1, WIDTH)},
     r"diffusers' Wan LoRA conversion cannot read it \(ValueError: `state_dict` should be empty"),
])
def test_a_file_diffusers_would_load_in_part_is_refused_at_load_naming_the_tensors(tiny, model_cache, tmp_path,
                                                                                   extra, message):
    p = "diffusion_model.blocks.0.self_attn.k"
    save_file({f"{p}.lora_down.weight": A2, f"{p}.lora_up.weight": B2, **extra}, tmp_path / "part.safetensors")
    registry = register(tmp_path, f"part:\n  path: {tiny}\n  max_sequence_length: 64\n"
                                  f"  adapters: [{{path: {tmp_path / 'part.safetensors'}}}]\n")
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    with pytest.raises(AdapterRefused, match=rf"^model 'part': adapters\[0\]: .*part\.safetensors: {message}"):
        engine.pipeline("part")
    assert engine.loaded() == ()


def test_a_musubi_file_missing_a_module_is_refused_not_a_key_error(tiny, model_cache, tmp_path):
    """musubi's converter pops every module of every block: one left out is diffusers' KeyError, refused by name."""
    musubi_file(tmp_path / "m.safetensors")
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "m.safetensors")
    del tensors["lora_unet_blocks_1_ffn_2.lora_up.weight"]
    save_file(tensors, tmp_path / "m.safetensors")
    registry = register(tmp_path, f"m:\n  path: {tiny}\n  adapters: [{{path: {tmp_path / 'm.safetensors'}}}]\n")
    with pytest.raises(AdapterRefused, match=r"m\.safetensors: diffusers' Wan LoRA conversion cannot read it "
                                             r"\(KeyError: 'blocks_1_ffn_2\.lora_up\.weight'\)"):
        Engine(EngineConfig(cache_dir=model_cache), registry).pipeline("m")
