"""What `reelbatch toy train` is run with: every stage's steps, batches and rates (toyworld.train runs the stages,
toyworld.train_transformer stages 4 and 5). Apart from both so that each imports it without importing the other."""

from __future__ import annotations

from dataclasses import dataclass

from toyworld.model import TOY_SEED


@dataclass(frozen=True)
class TrainConfig:
    seed: int = TOY_SEED
    vae_steps: int = 1500
    vae_batch: int = 8
    vae_lr: float = 2e-3
    vae_frames: int = 9
    # The VAE is convolutional and may train on crops of larger clips (at 48x48, 32x32 crops halved a step's cost);
    # at the toy's 32x32 a crop is the whole frame.
    vae_crop: int = 32
    kl_weight: float = 1e-6
    object_weight: float = 4.0  # extra loss weight on object pixels
    edge_weight: float = 8.0  # and on the object's outline
    # and on the pixels where the other shape would differ (a square's corners, the background in a disc's box):
    # they are what tells a circle from a square, ~20% of the object, and blur rounds them off first (a decoder
    # fine-tune of the run-4 VAE with this weight at 16 kept squares in 87.5% of reconstructions instead of 82.5%).
    shape_weight: float = 8.0
    # 200, not run 6's 100: at 100 a red object on black turned purple to blue from frame 16 of a 33-frame clip
    # (RMS error 0.15 -> 0.30), which long videos showed as a colour change in their last windows.
    decoder_steps: int = 200
    decoder_batch: int = 4
    decoder_frames: int = 33
    latent_clips: int = 9600  # 120 per prompt
    steps: int = 9000
    batch: int = 32
    lr: float = 2e-3
    warmup: int = 100
    ema: float = 0.998
    prompt_dropout: float = 0.1
    # Stage 5. prefix_latents is the toy registration's chunk_overlap (engine.models.registry.TOY, a test checks).
    continuation_steps: int = 320
    continuation_lr: float = 5e-4
    continuation_ema: float = 0.99
    continuation_fraction: float = 0.5
    continuation_clips: int = 800  # 10 per prompt
    prefix_latents: int = 2
    checkpoint_every: int = 100
    log_every: int = 25
