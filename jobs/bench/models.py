"""Models for `reelbatch bench`: diffusers' real Wan architecture at real widths, with random weights.

No model hub is reachable, and a benchmark needs the compute of a real model, not its knowledge: a random
Wan2.1-T2V-1.3B runs the same kernels on the same shapes as the trained one. Each model is built once into the cache
folder (as `tiny` is) and then loaded by WanPipeline from disk, like any registered model. Wan 2.2's two
architectures are here at full size (for a GPU) and at their real widths with fewer blocks (for this CPU).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from engine.models.registration import Adapter, Sampler
from engine.models.registry import ModelDefaults, ModelInfo
from engine.models.tiny import build_byte_tokenizer, ensure_built

BENCH_SEED = 20261202

# Wan2.1-T2V-1.3B-Diffusers' transformer config (transformer/config.json of the published folder).
WAN_13B_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6, rope_max_seq_len=1024,
)
# google/umt5-xxl, the text encoder every Wan2.1 model ships with (vocabulary aside: the byte tokenizer's is used,
# which changes only the size of the embedding table, not the compute per token).
UMT5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, feed_forward_proj="gated-gelu",
                relative_attention_num_buckets=32, relative_attention_max_distance=128)


def _umt5_xxl(tokenizer):
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), pad_token_id=0, eos_token_id=1,
                                       decoder_start_token_id=0, **UMT5_XXL))


def build_wan_13b(device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    """The full Wan2.1-T2V-1.3B pipeline with random weights: its transformer, its VAE (AutoencoderKLWan's defaults
    are Wan2.1's VAE) and a UMT5-XXL encoder. Built on `device` in `dtype` (the 5.7B-parameter encoder would take
    minutes to initialise on a CPU); the VAE stays fp32, as the engine runs it."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(BENCH_SEED)
        text_encoder = _umt5_xxl(tokenizer).to(dtype)
        transformer = WanTransformer3DModel(**WAN_13B_TRANSFORMER).to(dtype)
        vae = AutoencoderKLWan()
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def build_wan_widths_cpu(layers: int = 2):
    """Wan2.1-1.3B's layer widths (hidden 1536 = 12 heads x 128, ffn 8960, freq 256) with `layers` blocks, so a
    CPU spends its time in the same matmul shapes as the real model. Text encoder and VAE are small (the text is
    cached by the engine, and the VAE decodes once per video), so denoising dominates as it does for real models."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BENCH_SEED)
        text_encoder = _small_text_encoder(tokenizer)
        transformer = WanTransformer3DModel(**{**WAN_13B_TRANSFORMER, "text_dim": 256, "num_layers": layers})
        # Wan's VAE layout (8x spatial, 4x temporal, 16 latent channels) at a third of its width.
        vae = AutoencoderKLWan(base_dim=32, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


# Wan2.2-T2V-A14B's two transformers: each the Wan 2.1 14B configuration (diffusers'
# scripts/convert_wan_to_diffusers.py, "Wan2.2-T2V-A14B"; Wan2.2's wan/configs/wan_t2v_A14B.py: dim 5120, ffn 13824,
# 40 heads, 40 layers).
WAN22_A14B_TRANSFORMER = {**WAN_13B_TRANSFORMER, "num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}
# Wan2.2-TI2V-5B's transformer (the same script, "Wan2.2-TI2V-5B"; wan/configs/wan_ti2v_5B.py): dim 3072 (24 heads x
# 128), ffn 14336, 30 layers, 48 latent channels in and out.
WAN22_TI2V_TRANSFORMER = {**WAN_13B_TRANSFORMER, "num_attention_heads": 24, "ffn_dim": 14336, "in_channels": 48,
                          "out_channels": 48}
# The Wan 2.2 VAE (Wan2.2-TI2V-5B-Diffusers' vae/config.json, as the script's vae22_diffusers_config): 16x spatial
# (pixels patchified 2x2 into 12 channels, then 3 down-samplings), 4x temporal, 48 latent channels, residual blocks.
# Its per-channel latents_mean/std are left at 0 and 1: with random weights they change no compute.
WAN22_VAE = dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                 temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
                 patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4, latents_mean=[0.0] * 48,
                 latents_std=[1.0] * 48)


def _unipc(flow_shift: float):
    """The published Wan 2.2 folders' scheduler (convert_wan_to_diffusers.py: flow_shift 3.0 for T2V-A14B, 5.0 for
    TI2V-5B)."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   flow_shift=flow_shift)


def build_wan22_a14b(device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    """Wan2.2-T2V-A14B with random weights: two 14B experts switched at 0.875, the Wan 2.1 VAE, UMT5-XXL. 57 GB of
    transformers in bf16: build it where it fits (an H200), in memory or in a cache on a large disk."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(BENCH_SEED)
        text_encoder = _umt5_xxl(tokenizer).to(dtype)
        transformer = WanTransformer3DModel(**WAN22_A14B_TRANSFORMER).to(dtype)
        transformer_2 = WanTransformer3DModel(**WAN22_A14B_TRANSFORMER).to(dtype)
        vae = AutoencoderKLWan()
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       transformer_2=transformer_2, scheduler=_unipc(3.0), boundary_ratio=0.875)


def build_wan22_ti2v(device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    """Wan2.2-TI2V-5B with random weights: its transformer, the Wan 2.2 VAE (fp32) and UMT5-XXL."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(BENCH_SEED)
        text_encoder = _umt5_xxl(tokenizer).to(dtype)
        transformer = WanTransformer3DModel(**WAN22_TI2V_TRANSFORMER).to(dtype)
        vae = AutoencoderKLWan(**WAN22_VAE)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=_unipc(5.0), expand_timesteps=True)


def _small_text_encoder(tokenizer):
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(
        vocab_size=len(tokenizer), d_model=256, d_kv=64, d_ff=512, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )).requires_grad_(False).eval()


def build_wan22_a14b_widths_cpu(layers: int = 1, device: str = "cpu"):
    """Wan2.2-T2V-A14B's layer widths (hidden 5120, ffn 13824) in two experts of `layers` blocks, switched at 0.875;
    small text encoder, and Wan's VAE layout at a third of its width (as build_wan_widths_cpu). `device`: "meta"
    builds the architecture without memory (tests/jobs/test_bench_wan22.py)."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    tokenizer = build_byte_tokenizer()
    widths = {**WAN22_A14B_TRANSFORMER, "text_dim": 256, "num_layers": layers}
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(BENCH_SEED)
        text_encoder = _small_text_encoder(tokenizer)
        transformer, transformer_2 = WanTransformer3DModel(**widths), WanTransformer3DModel(**widths)
        vae = AutoencoderKLWan(base_dim=32, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       transformer_2=transformer_2, scheduler=_unipc(3.0), boundary_ratio=0.875)


def build_wan22_ti2v_widths_cpu(layers: int = 2, device: str = "cpu"):
    """Wan2.2-TI2V-5B's layer widths (hidden 3072, ffn 14336, 48 channels) in `layers` blocks, with per-token
    timesteps; small text encoder, and the Wan 2.2 VAE's layout at a fifth of its width."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(BENCH_SEED)
        text_encoder = _small_text_encoder(tokenizer)
        transformer = WanTransformer3DModel(**{**WAN22_TI2V_TRANSFORMER, "text_dim": 256, "num_layers": layers})
        vae = AutoencoderKLWan(**{**WAN22_VAE, "base_dim": 32, "decoder_base_dim": 48, "num_res_blocks": 1})
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=_unipc(5.0), expand_timesteps=True)


def ensure_bench_model(cache_dir: Path, name: str) -> Path:
    """Path of the saved benchmark model `name` (a key of BUILDERS), built on first use."""
    return ensure_built(cache_dir, name, BUILDERS[name])


BUILDERS: dict[str, Callable[[], object]] = {
    "bench-wan-widths-v1": build_wan_widths_cpu,
    "bench-wan-1.3b-v1": build_wan_13b,
    "bench-wan22-a14b-widths-v1": build_wan22_a14b_widths_cpu,
    "bench-wan22-ti2v-widths-v1": build_wan22_ti2v_widths_cpu,
    "bench-wan22-a14b-v1": build_wan22_a14b,
    "bench-wan22-ti2v-v1": build_wan22_ti2v,
}


# A few-step registration of bench-wan-widths-v1 (the `cpu-fast` preset): what a step-distilled Wan 2.1 costs, with
# random weights. Rank 32 on every attention and feed-forward projection (the published Wan 2.1 step-distill LoRAs
# are rank 32-128; fused at load, the rank costs nothing per step), flow_euler at shift 3, 4 steps at guidance 1,
# and a light decoder of TAEHV's layout a quarter as wide (TAEHV's decoder: 256, 128, 64, 64; this VAE is a third of
# Wan's width).
FAST = "bench-wan-widths-fast-v1"
FAST_BASE = "bench-wan-widths-v1"
FAST_RANK = 32
FAST_DECODER_CHANNELS = (64, 32, 16, 16)
ADAPTER_FILE = "adapter.safetensors"
DECODER_FOLDER = "decoder"


def bench_fast_info(cache_dir: Path, shape: ModelDefaults) -> ModelInfo:
    """The `cpu-fast` preset's registration: the bench folder, its random LoRA, sampler and light decoder (built
    into the cache on first use), at 4 steps and guidance 1 in the preset's shape. No teacher: random weights have
    no quality to gate."""
    folder = ensure_bench_model(cache_dir, FAST_BASE)
    extras = ensure_fast_extras(cache_dir, folder)
    return ModelInfo(name=FAST, defaults=replace(shape, steps=4, guidance=1.0), path=folder, max_frames=81,
                     adapters=(Adapter(extras / ADAPTER_FILE),), sampler=Sampler("flow_euler", 3.0),
                     decoder=extras / DECODER_FOLDER)


def ensure_fast_extras(cache_dir: Path, base: Path) -> Path:
    """cache_dir/models/FAST: a random LoRA in diffusers' layout for `base`'s transformer and a random light decoder
    for its VAE's latents, built once (into a temporary folder renamed into place, as ensure_built does)."""
    target = Path(cache_dir) / "models" / FAST
    if (target / DECODER_FOLDER / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{FAST}-", dir=target.parent))
    try:
        _build_fast_extras(base, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / DECODER_FOLDER / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_fast_extras(base: Path, folder: Path) -> None:
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from engine.adapters import light_decoder
    transformer = WanTransformer3DModel.from_pretrained(base, subfolder="transformer")
    vae = AutoencoderKLWan.from_pretrained(base, subfolder="vae").config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BENCH_SEED + 1)
        transformer.add_adapter(LoraConfig(r=FAST_RANK, lora_alpha=FAST_RANK, init_lora_weights="gaussian",
                                           target_modules=["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj",
                                                           "ffn.net.2"]))
        lora = get_peft_model_state_dict(transformer)
        for key, value in lora.items():
            if "lora_B" in key:  # PEFT starts B at zero (no change); a distilled LoRA's B is not
                value.normal_(0.0, 0.01)
        WanPipeline.save_lora_weights(folder, transformer_lora_layers=lora, weight_name=ADAPTER_FILE,
                                      safe_serialization=True)
        decoder = light_decoder.LightDecoder(light_decoder.DecoderConfig(
            latent_channels=vae.z_dim, spatial_factor=vae.scale_factor_spatial,
            temporal_factor=vae.scale_factor_temporal, channels=FAST_DECODER_CHANNELS, blocks=1,
            latents_mean=tuple(vae.latents_mean), latents_std=tuple(vae.latents_std)))
    light_decoder.save(decoder, folder / DECODER_FOLDER)
