"""The built-in `tiny` model: diffusers' real Wan architecture at toy widths, with random weights.

It exists so that every path (batching, encoding, storage, the job system) can be exercised in seconds on a CPU.
Its weights are random, so its videos are noise. It is built once from a fixed config and seed, saved as a
diffusers folder (safetensors only) in the cache, and from then on loaded like any registered model.

Wan 2.2's two architectures are built the same way, for tests: `tiny-a14b` (two transformers switched at a boundary,
as Wan2.2-T2V-A14B) and `tiny-ti2v` (the Wan 2.2 VAE and per-token timesteps, as Wan2.2-TI2V-5B). A models file
registers their folders like any other (tests/engine/wan22.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# torch, diffusers and transformers are imported in the builders: naming a built-in's folder (builtin_folder) needs
# none of them.
from engine.models.shape_rules import TINY_RULES

# Bump when the config below changes, so an old cached build is never loaded for a new config.
TINY_VERSION = "tiny-v1"
TINY_A14B_VERSION = "tiny-a14b-v1"
TINY_TI2V_VERSION = "tiny-ti2v-v1"
TINY_I2V_VERSION = "tiny-i2v-v1"
TINY_SEED = 20261130

# Byte-level vocabulary: 3 specials, then one token per byte value.
_SPECIALS = ["<pad>", "</s>", "<unk>"]


def build_byte_tokenizer():
    """A tokenizer with one token per UTF-8 byte, built with `tokenizers` (no download, no training)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(_SPECIALS + byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def _text_encoder(tokenizer):
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    ))


def _transformer(channels: int):
    from diffusers import WanTransformer3DModel

    # Its patch and rotary positions are TINY_RULES', the shape rules a manifest is checked against: 256 positions
    # of 2x2 patches cover 4096 px a side, beyond the 2048 a manifest may ask for.
    return WanTransformer3DModel(
        patch_size=TINY_RULES.patch, num_attention_heads=2, attention_head_dim=16, in_channels=channels,
        out_channels=channels, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=TINY_RULES.rope_max_seq_len,
    )


def build_tiny_pipeline():
    """The tiny WanPipeline in memory, deterministic from TINY_SEED."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        # 8x spatial and 4x temporal compression, as Wan2.1's VAE (so frames are 4k+1 and sides multiples of 16).
        vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
        text_encoder = _text_encoder(tokenizer)
        transformer = _transformer(16)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=scheduler)


def _unipc(flow_shift: float):
    """The scheduler both published Wan 2.2 folders ship (diffusers' scripts/convert_wan_to_diffusers.py: UniPC with
    flow sigmas, 1000 training timesteps; flow_shift 3.0 for T2V-A14B, 5.0 for TI2V-5B). Multistep, so it keeps
    state between steps: the engine's loop must call it exactly as the pipeline does."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                   num_train_timesteps=1000, flow_shift=flow_shift)


def build_tiny_a14b_pipeline():
    """Wan2.2-T2V-A14B's layout at tiny widths: the Wan 2.1 VAE (8x spatial), a high-noise `transformer` and a
    low-noise `transformer_2` (different random weights), switched at boundary_ratio 0.875 (the published
    model_index.json; Wan2.2's wan/configs/wan_t2v_A14B.py: boundary 0.875). At 4 steps its timesteps are 999, 900,
    750, 500: two steps on each expert."""
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED + 1)
        vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
        text_encoder = _text_encoder(tokenizer)
        transformer, transformer_2 = _transformer(16), _transformer(16)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       transformer_2=transformer_2, scheduler=_unipc(3.0), boundary_ratio=0.875)


def build_tiny_ti2v_pipeline():
    """Wan2.2-TI2V-5B's layout at tiny widths: the Wan 2.2 VAE (residual blocks, pixels patchified 2x2 into 12
    channels, 3 down-samplings: 16x spatial and 4x temporal, z_dim 48, as the published vae/config.json), a
    48-channel transformer with 2x2 patches (so sides are multiples of 32), and expand_timesteps=True (a timestep
    per token)."""
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline

    tokenizer = build_byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED + 2)
        # Per-channel latent statistics of no particular meaning, but not 0 and 1, so the decode's un-normalising
        # is exercised.
        mean = torch.linspace(-0.3, 0.5, 48).tolist()
        std = torch.linspace(0.5, 1.5, 48).flip(0).tolist()
        vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                               out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                               latents_mean=mean, latents_std=std)
        text_encoder = _text_encoder(tokenizer)
        transformer = _transformer(48)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=_unipc(5.0), expand_timesteps=True)
def build_tiny_i2v_pipeline():
    """`tiny-i2v`: diffusers' Wan 2.1 image-to-video architecture (WanImageToVideoPipeline: a CLIP image encoder,
    and a transformer that reads 16 latent + 4 mask + 16 condition channels and attends to the image's embedding)
    at toy widths, random weights, deterministic from TINY_SEED. Its text encoder, tokenizer and VAE are `tiny`'s."""
    import torch
    import transformers
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPVisionConfig, CLIPVisionModel

    # transformers 5 names the Pillow-backed processor apart (the plain name wants torchvision); older ones have
    # only the plain name, which is Pillow-backed there.
    processor = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor

    base = build_tiny_pipeline()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED + 1)
        image_encoder = CLIPVisionModel(CLIPVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
            patch_size=8, projection_dim=16,
        ))
        # Wan2.1-I2V's layout at toy widths: image_dim is the image encoder's width, added_kv_proj_dim the
        # transformer's (heads x head dim).
        transformer = WanTransformer3DModel(
            patch_size=TINY_RULES.patch, num_attention_heads=2, attention_head_dim=16, in_channels=36,
            out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=TINY_RULES.rope_max_seq_len, image_dim=16,
            added_kv_proj_dim=32,
        )
    image_processor = processor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return WanImageToVideoPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                                   scheduler=base.scheduler, image_processor=image_processor,
                                   image_encoder=image_encoder, transformer=transformer)


def ensure_tiny(cache_dir: Path) -> Path:
    """Path of the saved tiny model, building it on first use."""
    return ensure_built(cache_dir, TINY_VERSION, build_tiny_pipeline)


def ensure_tiny_a14b(cache_dir: Path) -> Path:
    return ensure_built(cache_dir, TINY_A14B_VERSION, build_tiny_a14b_pipeline)


def ensure_tiny_ti2v(cache_dir: Path) -> Path:
    return ensure_built(cache_dir, TINY_TI2V_VERSION, build_tiny_ti2v_pipeline)
# Built-in models made here rather than trained: registered name -> (cache folder, builder).
BUILDS: dict[str, tuple[str, Callable[[], object]]] = {
    "tiny": (TINY_VERSION, build_tiny_pipeline),
    "tiny-i2v": (TINY_I2V_VERSION, build_tiny_i2v_pipeline),
}


def builtin_folder(cache_dir: Path, name: str) -> Path:
    """Where the built-in model `name` is saved under `cache_dir` (built there on first use: ensure_builtin)."""
    return Path(cache_dir) / "models" / BUILDS[name][0]


def ensure_builtin(cache_dir: Path, name: str) -> Path:
    """Path of the saved built-in model `name`, building it on first use."""
    version, build = BUILDS[name]
    return ensure_built(cache_dir, version, build)


def ensure_built(cache_dir: Path, name: str, build: Callable[[], object]) -> Path:
    """Path of the pipeline `build()` makes, saved as cache_dir/models/`name` on first use.

    Several workers may start at once: each builds into its own temporary folder and renames it into place; the
    rename is atomic, and a loser simply discards its copy.
    """
    target = Path(cache_dir) / "models" / name
    if (target / "model_index.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build().save_pretrained(tmp, safe_serialization=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "model_index.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
