"""The `toy` model's architecture: diffusers' real Wan pipeline, small enough to train on a CPU in under an hour.

Only the architecture lives here; `toyworld.train` fills in the weights and the committed folder
(`engine/models/toy`) is what workers load. What the sizes are and why (from two trial runs on a 2-core CPU):

- VAE: 4x spatial and 2x temporal compression, base width 16, 8 latent channels. With Wan2.1's 8x VAE a shape is
  one or two latent cells and the transformer could not tell a circle from a square.
- 32x32 frames, 80 tokens a clip. At 48x48 (180 tokens) a transformer trained for 28 minutes followed the colour
  but not the direction (28%, chance 25%); at 32x32, 11 minutes reached 69% direction. Shapes are 50-56% of the
  frame (16-18 px, 4-4.5 latent cells) so the corners that tell a circle from a square survive the VAE.
- Transformer of ~1M parameters on 2x2 patches: 4x4 tokens per latent frame, 80 tokens for 9 frames.
- The text encoder is a UMT5 with random weights from a fixed seed, never trained: the transformer learns to read
  its features. The tokenizer is the same byte-level one as `tiny`'s.
"""

from __future__ import annotations

import torch

from engine.models.tiny import build_byte_tokenizer

TOY_SEED = 20261201
WIDTH = HEIGHT = 32
FRAMES = 9
FPS = 8
# Every prompt of the toy grammar is under 60 bytes; the pipeline pads embeddings to this length without a mask,
# so training and inference must use the same value.
MAX_SEQUENCE_LENGTH = 64
SCHEDULER_SHIFT = 3.0
SPATIAL, TEMPORAL = 4, 2
LATENT_CHANNELS = 8


def build_vae():
    from diffusers import AutoencoderKLWan

    # len(dim_mult) - 1 downsamples: two spatial (4x), the second also temporal (2x). The pipeline reads the scale
    # factors from the config to size latents and to check frame counts.
    return AutoencoderKLWan(
        base_dim=16, z_dim=LATENT_CHANNELS, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[False, True],
        latents_mean=[0.0] * LATENT_CHANNELS, latents_std=[1.0] * LATENT_CHANNELS,
        scale_factor_spatial=SPATIAL, scale_factor_temporal=TEMPORAL,
    )


def build_text_encoder(vocab_size: int):
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(
        vocab_size=vocab_size, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        relative_attention_num_buckets=16, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    ))


def build_transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS, text_dim=64, freq_dim=64, ffn_dim=256, num_layers=4, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=64,
    )


def build_toy_pipeline(seed: int = TOY_SEED):
    """The untrained pipeline, deterministic from `seed`: random VAE and transformer, the frozen text encoder."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = build_text_encoder(len(tokenizer))
        vae = build_vae()
        transformer = build_transformer()
    text_encoder.requires_grad_(False).eval()
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=SCHEDULER_SHIFT))
