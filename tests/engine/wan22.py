"""Wan 2.2's two architectures at tiny widths (engine.models.tiny), registered through a models file as an operator
registers a downloaded folder; shared by the engine's tests and the manifest's."""

from pathlib import Path

import numpy as np
import torch

from engine.engine import Engine
from engine.models.tiny import build_tiny_pipeline, ensure_tiny, ensure_tiny_a14b, ensure_tiny_ti2v
from engine.types import RenderBatch, RenderRequest, Shape

# The registered names, and a shape of each that renders in well under a second here. At 4 steps the A14B's
# timesteps are 999 and 900 (its high-noise expert: at or above 0.875 x 1000) then 750 and 500 (low-noise).
A14B, TI2V = "a14b", "ti2v"
SHAPES = {A14B: Shape(A14B, 64, 48, 9, 4, 4.0), TI2V: Shape(TI2V, 96, 64, 9, 4, 5.0),
          "wan21": Shape("wan21", 64, 48, 9, 4, 5.0)}
REQUESTS = (RenderRequest(1, "a red circle", None, 5), RenderRequest(2, "a blue square", "blurry", 6))


def frames(engine: Engine, model: str, requests=REQUESTS, shape: Shape | None = None) -> list[np.ndarray]:
    """The batch's videos' frames, failing on any video's error."""
    out = engine.render(RenderBatch(shape or SHAPES[model], requests))
    assert all(v.error is None for v in out), [v.error for v in out]
    return [v.frames for v in out]


def write_models_file(folder: Path, cache: Path, **extra: str) -> Path:
    """A models file registering the tiny Wan 2.2 folders (and tiny itself as `wan21`), built into `cache` on first
    use; `extra` adds YAML lines to an entry, e.g. a14b="offload_idle_expert: true"."""
    paths = {A14B: ensure_tiny_a14b(cache), TI2V: ensure_tiny_ti2v(cache), "wan21": ensure_tiny(cache)}
    text = ""
    for name, path in paths.items():
        text += f"{name}:\n  path: {path}\n  max_sequence_length: 64\n"
        text += "".join(f"  {line}\n" for line in extra.get(name, "").splitlines())
    models = folder / "models.yaml"
    models.write_text(text)
    return models


def build_i2v_a14b():
    """Wan2.2-I2V-A14B's layout at toy widths: WanImageToVideoPipeline with a high-noise `transformer` and a
    low-noise `transformer_2` that read 16 latent + 4 mask + 16 picture channels and attend to no image embedding
    (image_dim null), no image encoder or processor, and the published boundary_ratio 0.9."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel

    base = build_tiny_pipeline()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        experts = [WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                         in_channels=36, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64,
                                         num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                         rope_max_seq_len=256) for _ in range(2)]
    return WanImageToVideoPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                                   scheduler=base.scheduler, image_processor=None, image_encoder=None,
                                   transformer=experts[0], transformer_2=experts[1], boundary_ratio=0.9)
