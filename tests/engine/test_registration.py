"""A registration's adapters, sampler, light decoder and teacher: loaded as diffusers would, checked when the models
file is read, and part of the identity gates are recorded under. On the tiny model (real diffusers, random weights)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from engine.adapters import light_decoder
from engine.engine import Engine
from engine.errors import ModelNotFound
from engine.levers.config import EngineConfig
from engine.models.file import load_registry
from engine.models.registry import TINY
from engine.models.tiny import ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape

REQUESTS = (RenderRequest(1, "a red circle", None, 5), RenderRequest(2, "a blue square", "blurry", 6))


def make_lora(tiny, path, seed: int = 0, rank: int = 4, targets=("to_q", "to_v", "ffn.net.0.proj")) -> None:
    """A LoRA for the tiny transformer in diffusers' layout, B drawn at random (PEFT starts B at zero, which would
    change nothing)."""
    from diffusers import WanPipeline, WanTransformer3DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    transformer = WanTransformer3DModel.from_pretrained(tiny / "transformer")
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.2)
    WanPipeline.save_lora_weights(path.parent, transformer_lora_layers=get_peft_model_state_dict(transformer),
                                  weight_name=path.name)


def make_decoder(folder, channels: int = 16, spatial: int = 8, temporal: int = 4, seed: int = 0) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        decoder = light_decoder.LightDecoder(light_decoder.DecoderConfig(channels, spatial, temporal, (16, 8, 8, 8)))
    light_decoder.save(decoder, folder)


@pytest.fixture(scope="module")
def tiny(model_cache):
    return ensure_tiny(model_cache)


@pytest.fixture(scope="module")
def lora(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("lora") / "tiny-lora.safetensors"
    make_lora(tiny, path)
    return path


def models_file(tmp_path, text: str):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_exact_mode_of_an_adapter_registration_equals_a_plain_call_with_the_lora_fused(tiny, lora, tmp_path):
    registry = load_registry(models_file(tmp_path, f"tiny-lora:\n  path: {tiny}\n  max_sequence_length: 64\n"
                                                   f"  adapters: [{{path: {lora}, scale: 0.7}}]\n"))
    engine = Engine(EngineConfig(cache_dir=tmp_path).exact(), registry)
    shape = Shape("tiny-lora", 64, 48, 9, 3, 5.0)
    rendered = engine.render(RenderBatch(shape, REQUESTS))

    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(tiny, dtype={"default": torch.float32, "vae": torch.float32},
                                       use_safetensors=True)
    pipe.load_lora_weights(str(lora), adapter_name="mine")
    pipe.set_adapters(["mine"], adapter_weights=[0.7])
    pipe.fuse_lora(adapter_names=["mine"])
    pipe.unload_lora_weights()
    with torch.inference_mode():
        plain = pipe(prompt=[r.prompt for r in REQUESTS], negative_prompt=[r.negative_prompt or "" for r in REQUESTS],
                     height=48, width=64, num_frames=9, num_inference_steps=3, guidance_scale=5.0,
                     generator=[torch.Generator().manual_seed(r.seed) for r in REQUESTS], output_type="np",
                     max_sequence_length=64).frames
    expected = np.clip(np.rint(np.asarray(plain) * 255.0), 0, 255).astype(np.uint8)
    for video, frames in zip(rendered, expected):
        assert np.array_equal(video.frames, frames)
    # The adapter changed the render: the base model's frames differ.
    base = Engine(EngineConfig(cache_dir=tmp_path).exact(), load_registry(None))
    (plain_base, _) = base.render(RenderBatch(Shape("tiny", 64, 48, 9, 3, 5.0), REQUESTS))
    assert np.abs(plain_base.frames.astype(int) - rendered[0].frames.astype(int)).mean() > 1.0
    # Fused and unloaded: no LoRA layers are left to cost anything per step.
    assert not any("lora" in name for name, _ in engine.pipeline("tiny-lora").transformer.named_parameters())


def test_an_adapter_at_scale_zero_renders_the_base_model(tiny, lora, tmp_path):
    registry = load_registry(models_file(tmp_path, f"zero:\n  path: {tiny}\n  max_sequence_length: 64\n"
                                                   f"  adapters: [{{path: {lora}, scale: 0}}]\n"))
    engine = Engine(EngineConfig(cache_dir=tmp_path), registry)
    zero = engine.render(RenderBatch(Shape("zero", 32, 32, 5, 2, 5.0), REQUESTS))
    base = engine.render(RenderBatch(Shape("tiny", 32, 32, 5, 2, 5.0), REQUESTS))
    for a, b in zip(zero, base):
        assert np.array_equal(a.frames, b.frames)


def test_a_sampler_replaces_the_folders_scheduler(tiny, tmp_path):
    registry = load_registry(models_file(
        tmp_path, f"euler:\n  path: {tiny}\n  sampler: {{name: flow_euler, shift: 5.0, shift_terminal: 0.1}}\n"
                  f"unipc:\n  path: {tiny}\n  sampler: {{name: flow_unipc, shift: 3}}\n"
                  f"dpm:\n  path: {tiny}\n  sampler: {{name: flow_dpm, shift: 2}}\n"))
    engine = Engine(EngineConfig(cache_dir=tmp_path), registry)
    euler = engine.pipeline("euler").scheduler
    assert type(euler).__name__ == "FlowMatchEulerDiscreteScheduler" and euler.config.shift == 5.0
    euler.set_timesteps(4)
    # By hand: timesteps linspace(1000, 4.98, 4) (4.98: 1/1000 under shift 5), shifted by 5 to 1, 0.9097, 0.7173,
    # 0.0244, then stretched so the last is 0.1 (1 - (1 - s) / 1.0840), then 0.
    assert euler.sigmas.tolist() == pytest.approx([1.0, 0.9167, 0.7392, 0.1, 0.0], abs=1e-4)
    unipc = engine.pipeline("unipc").scheduler
    assert type(unipc).__name__ == "UniPCMultistepScheduler" and unipc.config.flow_shift == 3.0
    assert unipc.config.use_flow_sigmas and unipc.config.prediction_type == "flow_prediction"
    assert type(engine.pipeline("dpm").scheduler).__name__ == "DPMSolverMultistepScheduler"
    for name in ("unipc", "dpm"):  # each renders through the engine's loop
        (video,) = engine.render(RenderBatch(Shape(name, 32, 32, 5, 3, 1.0), REQUESTS[:1]))
        assert video.error is None


def test_guidance_one_runs_one_transformer_pass_a_step_and_encodes_no_negative_prompt(tiny, tmp_path):
    base = EngineConfig(cache_dir=tmp_path, text_cache=False)  # so every text is encoded, and seen here
    for config in (base, base.exact()):
        engine = Engine(config, load_registry(None))
        pipe = engine.pipeline("tiny")
        calls, texts = [], []
        hook = pipe.transformer.register_forward_hook(lambda m, a, o: calls.append(1))
        real = pipe.encode_prompt
        pipe.encode_prompt = lambda prompt, *a, **k: (texts.extend(prompt or []), real(prompt, *a, **k))[1]
        try:
            (video,) = engine.render(RenderBatch(Shape("tiny", 32, 32, 5, 4, 1.0), (REQUESTS[1],)))
        finally:
            hook.remove()
            del pipe.encode_prompt
        assert video.error is None
        assert len(calls) == 4, (config.batched_guidance, len(calls))
        assert texts == ["a blue square"], "the negative prompt ('blurry') is never encoded"


def test_the_light_decoder_replaces_the_vae_decoder(tiny, tmp_path):
    make_decoder(tmp_path / "decoder")
    registry = load_registry(models_file(tmp_path, f"light:\n  path: {tiny}\n  decoder: {tmp_path / 'decoder'}\n"))
    engine = Engine(EngineConfig(cache_dir=tmp_path), registry)
    shape = Shape("light", 32, 32, 9, 2, 1.0)
    request = RenderRequest(1, "x", None, 3, latents_only=True)
    (chunk,) = engine.render(RenderBatch(shape, (request,)))
    video = engine.decode("light", chunk.latents, request)
    decoder = light_decoder.load(tmp_path / "decoder")
    vae = engine.pipeline("light").vae
    z = chunk.latents[None] * torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1) \
        + torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        frames = decoder(z).clamp(-1, 1)[0].permute(1, 2, 3, 0).numpy()
    expected = np.clip(np.rint((frames + 1) / 2 * 255.0), 0, 255).astype(np.uint8)
    assert video.frames.shape == (9, 32, 32, 3)
    assert np.abs(video.frames.astype(int) - expected.astype(int)).max() <= 1
    # The VAE's encoder stays: a long video's ties are latents, and the pipeline still has it.
    assert engine.pipeline("light").vae.encoder is not None


def test_the_light_decoder_is_causal_and_gives_one_frame_for_latent_0():
    decoder = light_decoder.LightDecoder(light_decoder.DecoderConfig(8, 4, 2, (16, 8, 8)))
    z = torch.randn(1, 8, 5, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = decoder(z)
        changed = z.clone()
        changed[:, :, 3] += 1.0
        out2 = decoder(changed)
    assert out.shape == (1, 3, 9, 32, 32)  # 1 + 2 x 4 frames
    # Latent 3 makes frames 5 and 6 (1 + 2 x 2 .. 1 + 2 x 3 - 1); with one memory block per resolution it reaches
    # the frames after it, never those before.
    assert torch.equal(out[:, :, :5], out2[:, :, :5])
    assert not torch.equal(out[:, :, 5:7], out2[:, :, 5:7])


def test_identity_includes_adapters_sampler_and_decoder_and_is_unchanged_without_them(tiny, lora, tmp_path):
    """The identity the engine records and checks quality gates under (Engine.gate_identity): each addition makes
    another one, a scale alone too; the same folder with nothing added is the same identity under another name."""
    make_decoder(tmp_path / "decoder")
    registry = load_registry(models_file(tmp_path, (
        f"plain:\n  path: {tiny}\n"
        f"again:\n  path: {tiny}\n"
        f"lora:\n  path: {tiny}\n  adapters: [{{path: {lora}}}]\n"
        f"half:\n  path: {tiny}\n  adapters: [{{path: {lora}, scale: 0.5}}]\n"
        f"euler:\n  path: {tiny}\n  sampler: {{name: flow_euler, shift: 3}}\n"
        f"light:\n  path: {tiny}\n  decoder: {tmp_path / 'decoder'}\n")))
    engine = Engine(EngineConfig(cache_dir=tmp_path / "cache"), registry)
    ids = {name: engine.gate_identity(registry.get(name))
           for name in ("plain", "again", "lora", "half", "euler", "light")}
    assert ids["plain"] == ids["again"]
    assert len({ids[name] for name in ("plain", "lora", "half", "euler", "light")}) == 5


@pytest.mark.parametrize("entry, message", [
    ("adapters: [{path: MISSING}]", r"adapters\[0\]\.path: .*missing\.safetensors is not a file"),
    ("adapters: [{path: NOTST}]", r"adapters\[0\]\.path: .*lora\.bin is not a \.safetensors file"),
    ("adapters: [{path: OTHER}]", r"adapters\[0\]\.path: .*other-model\.safetensors: tensor 'transformer\.blocks\.0"
                                  r"\.attn1\.to_q\.lora_A\.weight' is \[4, 64\], but transformer\.blocks\.0\.attn1"
                                  r"\.to_q takes 32 inputs"),
    ("adapters: [{path: NOLAYER}]", r"adapters\[0\]\.path: .*: tensor 'transformer\.blocks\.7\.attn1\.to_q"
                                    r"\.lora_A\.weight': the base transformer has no layer 'blocks\.7\.attn1\.to_q'"),
    ("adapters: [{path: UNPAIRED}]", r"adapters\[0\]\.path: .*unpaired\.safetensors: tensor 'transformer\.blocks\.0"
                                     r"\.attn1\.to_q\.lora_A\.weight' has no 'transformer\.blocks\.0\.attn1\.to_q"
                                     r"\.lora_B\.weight' to pair with"),
    ("adapters: [{path: BARE}]", r"adapters\[0\]\.path: .*bare\.safetensors: tensor 'blocks\.0\.attn1\.to_q\.lora_A"
                                 r"\.weight' is in none of the layouts diffusers reads"),
    ("adapters: [{path: MIXED}]", r"adapters\[0\]\.path: .*mixed\.safetensors: tensor 'transformer\.blocks\.0\.attn1"
                                  r"\.to_q\.lora_A\.weight' is not named diffusion_model\.\* like the file's other "
                                  r"tensors"),
    ("sampler: {name: lcm_magic, shift: 3}", r"sampler\.name: unknown sampler 'lcm_magic' \(known: flow_euler, "
                                             r"flow_unipc, flow_dpm\)"),
    ("sampler: {name: flow_unipc, shift_terminal: 0.1}", r"sampler: unknown keys \['shift_terminal'\] for flow_unipc"),
    ("decoder: DECODER16", r"decoder: .*config\.json: latent_channels is 8, but the model's VAE has 16"),
    ("decoder: DECODERT", r"decoder: .*config\.json: temporal_factor is 2, but the model's VAE has 4"),
    ("decoder: /nonexistent/dec", r"decoder: /nonexistent/dec needs config\.json and "
                                  r"diffusion_pytorch_model\.safetensors"),
    ("teacher: nobody", r"teacher: 'nobody' is not another registered model"),
])
def test_bad_registrations_name_the_file_the_model_and_the_key(tiny, lora, tmp_path, entry, message):
    from safetensors.torch import save_file

    (tmp_path / "lora.bin").write_bytes(b"x")
    save_file({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 64),
               "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(32, 4)}, tmp_path / "other-model.safetensors")
    save_file({"transformer.blocks.7.attn1.to_q.lora_A.weight": torch.zeros(4, 32)}, tmp_path / "nolayer.safetensors")
    save_file({"blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 32)}, tmp_path / "bare.safetensors")
    save_file({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 32)}, tmp_path / "unpaired.safetensors")
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(4, 32),
               "transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 32)}, tmp_path / "mixed.safetensors")
    make_decoder(tmp_path / "dec16", channels=8)
    make_decoder(tmp_path / "dect", channels=16, temporal=2)
    for token, value in (("MISSING", tmp_path / "missing.safetensors"), ("NOTST", tmp_path / "lora.bin"),
                         ("OTHER", tmp_path / "other-model.safetensors"), ("NOLAYER", tmp_path / "nolayer.safetensors"),
                         ("BARE", tmp_path / "bare.safetensors"),
                         ("UNPAIRED", tmp_path / "unpaired.safetensors"),
                         ("MIXED", tmp_path / "mixed.safetensors"), ("LORA", lora), ("DECODER16", tmp_path / "dec16"),
                         ("DECODERT", tmp_path / "dect")):
        entry = entry.replace(token, str(value))
    path = models_file(tmp_path, f"bad:\n  path: {tiny}\n  {entry}\n")
    with pytest.raises(ModelNotFound, match=f"^{path}: model 'bad': {message}"):
        load_registry(path)


def test_a_bad_registration_stops_a_command_with_exit_2_and_no_traceback(tiny, tmp_path, model_cache):
    path = models_file(tmp_path, f"bad:\n  path: {tiny}\n  sampler: {{name: ddim}}\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(model_cache), "REELBATCH_MODELS": str(path)}
    proc = subprocess.run([sys.executable, "-m", "jobs", "quality", "--model", "bad"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"REELBATCH_MODELS: {path}: model 'bad': sampler.name: unknown sampler 'ddim'" in proc.stderr


def test_two_registrations_share_a_folder_with_their_own_names_and_shape_keys(tiny, lora, tmp_path):
    registry = load_registry(models_file(tmp_path, (
        f"wan:\n  path: {tiny}\n"
        f"wan-fast:\n  path: {tiny}\n  adapters: [{{path: {lora}}}]\n  defaults: {{steps: 4, guidance: 1.0}}\n")))
    assert registry.get("wan").path == registry.get("wan-fast").path
    assert registry.get("wan-fast").defaults.steps == 4 and registry.get("wan-fast").adapters[0].scale == 1.0
    assert Shape("wan", 64, 64, 9, 4, 1.0).key() != Shape("wan-fast", 64, 64, 9, 4, 1.0).key()
    assert TINY.adapters == () and TINY.teacher is None

