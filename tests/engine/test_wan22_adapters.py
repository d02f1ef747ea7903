"""Adapters per expert (issue 22): a Wan 2.2 A14B registration gives each expert its own LoRA, as few-step Wan 2.2
adapters are published in high-noise and low-noise pairs (both files naming their tensors `transformer.*`). On the
tiny-width A14B build (engine.models.tiny), real diffusers and PEFT."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine.engine import Engine
from engine.errors import ModelNotFound
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.models.tiny import ensure_tiny_a14b, ensure_tiny_ti2v
from engine.types import RenderBatch, Shape

from .wan22 import REQUESTS

# What each file adapts (module -> rank) and the scale it is registered at. Both name blocks.0.attn1.to_q, so the
# test sees that each expert took its own file's numbers there; each also names a module the other leaves alone.
HIGH = {"blocks.0.attn1.to_q": 2, "blocks.1.ffn.net.0.proj": 2}
LOW = {"blocks.0.attn1.to_q": 3, "blocks.0.attn2.to_k": 3}
HIGH_SCALE, LOW_SCALE = 0.5, 1.5


def base_weights(folder, component: str) -> dict[str, torch.Tensor]:
    from diffusers import WanTransformer3DModel

    return dict(WanTransformer3DModel.from_pretrained(folder / component).state_dict())


def write_lora(path, weights: dict[str, torch.Tensor], modules: dict[str, int], seed: int):
    """A LoRA in diffusers' layout (`transformer.<module>.lora_A.weight` rank x in, `.lora_B.weight` out x rank, no
    alphas: scale 1 per unit of adapter scale), random A and B; returns module -> (A, B)."""
    generator = torch.Generator().manual_seed(seed)
    tensors, pairs = {}, {}
    for module, rank in modules.items():
        out_features, in_features = weights[f"{module}.weight"].shape
        a = torch.randn(rank, in_features, generator=generator) * 0.2
        b = torch.randn(out_features, rank, generator=generator) * 0.2
        tensors[f"transformer.{module}.lora_A.weight"], tensors[f"transformer.{module}.lora_B.weight"] = a, b
        pairs[module] = (a, b)
    save_file(tensors, path)
    return pairs


@pytest.fixture(scope="module")
def a14b(model_cache):
    return ensure_tiny_a14b(model_cache)


@pytest.fixture(scope="module")
def pair(a14b, tmp_path_factory):
    """The high-noise and low-noise files, each written against its own expert's base weights."""
    folder = tmp_path_factory.mktemp("pair")
    bases = {c: base_weights(a14b, c) for c in ("transformer", "transformer_2")}
    high = write_lora(folder / "high.safetensors", bases["transformer"], HIGH, seed=1)
    low = write_lora(folder / "low.safetensors", bases["transformer_2"], LOW, seed=2)
    return folder, bases, high, low


def models_file(tmp_path, text: str):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def pair_entry(name: str, a14b, folder, high: str = "high_noise", low: str = "low_noise") -> str:
    return (f"{name}:\n  path: {a14b}\n  max_sequence_length: 64\n  adapters:\n"
            f"    - {{path: {folder / 'high.safetensors'}, scale: {HIGH_SCALE}, expert: {high}}}\n"
            f"    - {{path: {folder / 'low.safetensors'}, scale: {LOW_SCALE}, expert: {low}}}\n")


def test_each_expert_changes_by_its_own_lora_and_the_other_not(a14b, pair, model_cache, tmp_path):
    """After load, each expert's weight is its base weight plus B @ A x scale of its own file, for the modules its
    file names; every other tensor of either expert is its base tensor bit for bit (so the high-noise file's
    feed-forward change is not in transformer_2, nor the low-noise file's attn2.to_k in transformer)."""
    folder, bases, high, low = pair
    registry = load_registry(models_file(tmp_path, pair_entry("pair", a14b, folder)))
    assert [(a.path.name, a.scale, a.expert) for a in registry.get("pair").adapters] == \
        [("high.safetensors", 0.5, "high_noise"), ("low.safetensors", 1.5, "low_noise")]
    pipe = Engine(EngineConfig(cache_dir=model_cache), registry).pipeline("pair")
    for component, lora, scale in (("transformer", high, HIGH_SCALE), ("transformer_2", low, LOW_SCALE)):
        fused = dict(getattr(pipe, component).state_dict())
        assert set(fused) == set(bases[component]), "fused and unloaded: no LoRA layers left"
        changed = {f"{module}.weight" for module in lora}
        for name, base in bases[component].items():
            if name in changed:
                a, b = lora[name.removesuffix(".weight")]
                torch.testing.assert_close(fused[name] - base, b @ a * scale, rtol=0, atol=1e-6)
                assert (fused[name] - base).abs().max() > 0.01, (component, name)
            else:
                assert torch.equal(fused[name], base), (component, name)
    # The two experts' shared module took different numbers: each its own file's.
    q = "blocks.0.attn1.to_q.weight"
    assert not torch.equal(pipe.transformer.state_dict()[q] - bases["transformer"][q],
                           pipe.transformer_2.state_dict()[q] - bases["transformer_2"][q])


def test_a_render_with_the_pair_works_and_differs_from_the_base(a14b, pair, model_cache, tmp_path):
    """Through the engine's loop: the high-noise expert for the first two of 4 steps, the low-noise one after, each
    fused with its own file; the videos differ from the unadapted model's."""
    folder = pair[0]
    registry = load_registry(models_file(tmp_path, pair_entry("pair", a14b, folder)
                                         + f"plain:\n  path: {a14b}\n  max_sequence_length: 64\n"))
    engine = Engine(EngineConfig(cache_dir=model_cache), registry)
    adapted = engine.render(RenderBatch(Shape("pair", 64, 48, 9, 4, 4.0), REQUESTS))
    plain = engine.render(RenderBatch(Shape("plain", 64, 48, 9, 4, 4.0), REQUESTS))
    for video, base in zip(adapted, plain):
        assert video.error is None and video.frames.shape == (9, 48, 64, 3)
        assert not np.array_equal(video.frames, base.frames)
    # The frames of a random tiny model move little; its latents show the change plainly.
    latents = {name: torch.stack([v.latents for v in engine.render(RenderBatch(
        Shape(name, 64, 48, 9, 4, 4.0), tuple(dataclasses.replace(r, latents_only=True) for r in REQUESTS)))])
        for name in ("pair", "plain")}
    assert (latents["pair"] - latents["plain"]).abs().max() > 0.05


def test_a_low_noise_adapter_is_checked_against_transformer_2(a14b, tmp_path):
    """A folder whose low-noise expert has a third block: a file naming blocks.2 fits it as low_noise and is refused
    as high_noise (the high-noise expert has two blocks), naming the expert it was checked against."""
    from diffusers import WanTransformer3DModel

    folder = tmp_path / "deeper"
    folder.mkdir()
    for part in ("model_index.json", "scheduler", "text_encoder", "tokenizer", "transformer", "vae"):
        (folder / part).symlink_to(a14b / part)
    config = json.loads((a14b / "transformer_2" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    WanTransformer3DModel(**{**config, "num_layers": 3}).save_pretrained(folder / "transformer_2")
    save_file({"transformer.blocks.2.attn1.to_q.lora_A.weight": torch.zeros(2, 32),
               "transformer.blocks.2.attn1.to_q.lora_B.weight": torch.zeros(32, 2)}, tmp_path / "third.safetensors")
    entry = f"deep:\n  path: {folder}\n  adapters: [{{path: {tmp_path / 'third.safetensors'}, expert: EXPERT}}]\n"
    registry = load_registry(models_file(tmp_path, entry.replace("EXPERT", "low_noise")))
    assert registry.get("deep").adapters[0].expert == "low_noise"
    path = models_file(tmp_path, entry.replace("EXPERT", "high_noise"))
    with pytest.raises(ModelNotFound, match=rf"^{path}: model 'deep': adapters\[0\]\.path: .*third\.safetensors: "
                                            r"tensor 'transformer\.blocks\.2\.attn1\.to_q\.lora_A\.weight': the base "
                                            r"transformer has no layer 'blocks\.2\.attn1\.to_q'$"):
        load_registry(path)


@pytest.mark.parametrize("folder, entry, message", [
    ("ti2v", "{path: HIGH, expert: low_noise}",
     r"adapters\[0\]\.expert: low_noise is for two-expert folders \(Wan 2\.2 A14B\); .*/model_index\.json has no "
     r"boundary_ratio and transformer_2"),
    ("a14b", "{path: HIGH, expert: middle}", r"adapters\[0\]\.expert must be one of high_noise, low_noise, got "
                                             r"'middle'"),
    ("a14b", "{path: NAMED2, expert: low_noise}",
     r"adapters\[0\]\.path: .*named2\.safetensors: tensor 'transformer_2\.blocks\.0\.attn1\.to_q\.lora_A\.weight': "
     r"diffusers loads only tensors named transformer\.\*; name them so and give the adapter expert: low_noise"),
    ("a14b", "{path: HIGH, strength: 1}", r"adapters\[0\]: unknown key 'strength' \(known: path, scale, expert\)"),
])
def test_bad_expert_adapters_are_refused_naming_the_file_the_model_and_the_key(a14b, pair, model_cache, tmp_path,
                                                                               folder, entry, message):
    save_file({"transformer_2.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(2, 32)}, tmp_path / "named2.safetensors")
    base = a14b if folder == "a14b" else ensure_tiny_ti2v(model_cache)
    entry = entry.replace("HIGH", str(pair[0] / "high.safetensors")).replace("NAMED2",
                                                                            str(tmp_path / "named2.safetensors"))
    path = models_file(tmp_path, f"bad:\n  path: {base}\n  adapters: [{entry}]\n")
    with pytest.raises(ModelNotFound, match=f"^{path}(:[0-9]+)?: model 'bad': {message}"):
        load_registry(path)


def test_the_gate_identity_covers_the_expert(a14b, pair, tmp_path):
    """The same file at the same scale is another registration on the other expert; on the high-noise expert, named
    or left to the default, it is the registration it was before experts could be named."""
    high = pair[0] / "high.safetensors"
    registry = load_registry(models_file(tmp_path, "".join(
        f"{name}:\n  path: {a14b}\n  adapters: [{{path: {high}{extra}}}]\n"
        for name, extra in (("implicit", ""), ("high", ", expert: high_noise"), ("low", ", expert: low_noise")))))
    engine = Engine(EngineConfig(cache_dir=tmp_path / "cache"), registry)
    ids = {name: engine.gate_identity(registry.get(name)) for name in ("implicit", "high", "low")}
    assert ids["implicit"] == ids["high"] != ids["low"]
