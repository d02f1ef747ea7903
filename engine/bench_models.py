"""Models for `reelbatch bench`: diffusers' real Wan architecture at real widths, with random weights.

No model hub is reachable, and a benchmark needs the compute of a real model, not its knowledge: a random
Wan2.1-T2V-1.3B runs the same kernels on the same shapes as the trained one. Each model is built once into the cache
folder (as `tiny` is) and then loaded by WanPipeline from disk, like any registered model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from engine.tiny import build_byte_tokenizer, ensure_built

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


def build_wan_13b(device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    """The full Wan2.1-T2V-1.3B pipeline with random weights: its transformer, its VAE (AutoencoderKLWan's defaults
    are Wan2.1's VAE) and a UMT5-XXL encoder. Built on `device` in `dtype` (the 5.7B-parameter encoder would take
    minutes to initialise on a CPU); the VAE stays fp32, as the engine runs it."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(BENCH_SEED)
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), pad_token_id=0, eos_token_id=1,
                                                   decoder_start_token_id=0, **UMT5_XXL)).to(dtype)
        transformer = WanTransformer3DModel(**WAN_13B_TRANSFORMER).to(dtype)
        vae = AutoencoderKLWan()
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def build_wan_widths_cpu(layers: int = 2):
    """Wan2.1-1.3B's layer widths (hidden 1536 = 12 heads x 128, ffn 8960, freq 256) with `layers` blocks, so a
    CPU spends its time in the same matmul shapes as the real model. Text encoder and VAE are small (the text is
    cached by the engine, and the VAE decodes once per video), so denoising dominates as it does for real models."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BENCH_SEED)
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=len(tokenizer), d_model=256, d_kv=64, d_ff=512, num_layers=2, num_heads=4,
            relative_attention_num_buckets=32, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        ))
        transformer = WanTransformer3DModel(**{**WAN_13B_TRANSFORMER, "text_dim": 256, "num_layers": layers})
        # Wan's VAE layout (8x spatial, 4x temporal, 16 latent channels) at a third of its width.
        vae = AutoencoderKLWan(base_dim=32, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
    text_encoder.requires_grad_(False).eval()
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def ensure_bench_model(cache_dir: Path, name: str) -> Path:
    """Path of the saved benchmark model `name` (a key of BUILDERS), built on first use."""
    return ensure_built(cache_dir, name, BUILDERS[name])


BUILDERS: dict[str, Callable[[], object]] = {
    "bench-wan-widths-v1": build_wan_widths_cpu,
    "bench-wan-1.3b-v1": build_wan_13b,
}
