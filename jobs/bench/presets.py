"""What `reelbatch bench` renders: its presets (a model and a shape, with why each exists) and prompts. Plain values,
so the CLI can list them without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.quality.sample import sample_set


@dataclass(frozen=True)
class Preset:
    name: str
    why: str
    model: str  # a bench model built into the cache (jobs.bench.models), or "tiny"
    width: int
    height: int
    frames: int
    fps: int
    steps: int
    guidance: float
    videos: int
    batch: int
    max_sequence_length: int = 512
    temporal_factor: int = 4
    # A two-expert model's low-noise expert's scale, given to both sides (the pipeline's guidance_scale_2, the
    # registration's guidance_2). None: the same as `guidance`, as WanPipeline defaults.
    guidance_2: float | None = None
    # The registration reelbatch's side renders instead of `model`, at its own registered steps and guidance (the
    # baseline keeps `model` at the preset's): a bench model with a random-weight LoRA, sampler and light decoder
    # (jobs.bench.models.FAST). `reelbatch bench --model NAME` sets it for any preset.
    engine_model: str | None = None
    # x264's preset for both sides' MP4s (storage.codecs.PRESETS; x264's own default is medium).
    encoder_preset: str = "medium"


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu",
        "Wan2.1-1.3B's layer widths (hidden 1536, ffn 8960) in 2 blocks at 128x128, 17 frames: the denoiser's matmuls "
        "have the real model's shapes, and with 8 steps denoising is most of the wall time, as for real models.",
        model="bench-wan-widths-v1", width=128, height=128, frames=17, fps=16, steps=8, guidance=5.0,
        videos=8, batch=4,
    ),
    "small": Preset(
        "small",
        "Previews and thumbnails: short 32x32 clips of the trained toy model (smooth frames, like real previews), "
        "where per-call overhead, decoding and encoding are a large share of each video, so batching and overlap "
        "matter most.",
        model="toy", width=32, height=32, frames=9, fps=8, steps=20, guidance=5.0, videos=32, batch=16,
        max_sequence_length=64, temporal_factor=2,
    ),
    "cpu-fast": Preset(
        "cpu-fast",
        "The cpu preset's baseline (Wan2.1-1.3B widths, 8 steps, guidance 5: the plain diffusers script) against "
        "reelbatch rendering a few-step registration of the same folder: a random-weight LoRA fused at load, "
        "flow_euler, 4 steps at guidance 1 (one pass a step) and a random light decoder for Wan's 16-channel, 8x "
        "spatial and 4x temporal latents. Random weights, so speed only: what a distilled Wan 2.1 would cost.",
        model="bench-wan-widths-v1", width=128, height=128, frames=17, fps=16, steps=8, guidance=5.0,
        videos=8, batch=4, engine_model="bench-wan-widths-fast-v1",
    ),
    "wan-1.3b": Preset(
        "wan-1.3b",
        "The full Wan2.1-T2V-1.3B architecture with random weights (the real model's compute) at its published "
        "defaults: 832x480, 81 frames, 50 steps, guidance 5, bf16. For a GPU.",
        model="bench-wan-1.3b-v1", width=832, height=480, frames=81, fps=16, steps=50, guidance=5.0,
        videos=8, batch=4,
    ),
    # Wan 2.2 (issue 22): each architecture at full size for a GPU, and at its real widths with fewer blocks for a CPU,
    # where the CPU presets' shapes are those of scripts/wan22_loop_ratio.py (192 tokens a video: 3 latent frames of
    # 8x8 patches), so the two measurements can be read together (docs/PERFORMANCE.md).
    "a14b": Preset(
        "a14b",
        "The full Wan2.2-T2V-A14B architecture with random weights: two 14B experts switched at 0.875, at its "
        "published 1280x720, 81 frames, 40 steps, guidance 4 (high noise) and 3 (low noise), bf16. For a GPU with "
        "the memory for both experts (57 GB) and a cache disk for the built folder (about 70 GB).",
        model="bench-wan22-a14b-v1", width=1280, height=720, frames=81, fps=16, steps=40, guidance=4.0,
        guidance_2=3.0, videos=4, batch=2,
    ),
    "ti2v": Preset(
        "ti2v",
        "The full Wan2.2-TI2V-5B architecture with random weights (per-token timesteps, the Wan 2.2 VAE) at its "
        "published 1280x704, 121 frames at 24 fps, 50 steps, guidance 5, bf16. For a GPU.",
        model="bench-wan22-ti2v-v1", width=1280, height=704, frames=121, fps=24, steps=50, guidance=5.0,
        videos=4, batch=2,
    ),
    "a14b-cpu": Preset(
        "a14b-cpu",
        "Wan2.2-T2V-A14B's layer widths (hidden 5120, ffn 13824) in 1 block per expert, switched at 0.875, at 128x128, "
        "9 frames, 4 steps (2 on each expert), guidance 4 and 3: the expert switch and both experts' matmul shapes "
        "on a CPU.",
        model="bench-wan22-a14b-widths-v1", width=128, height=128, frames=9, fps=16, steps=4, guidance=4.0,
        guidance_2=3.0, videos=4, batch=2,
    ),
    "ti2v-cpu": Preset(
        "ti2v-cpu",
        "Wan2.2-TI2V-5B's layer widths (hidden 3072, ffn 14336, 48 latent channels) in 2 blocks with per-token "
        "timesteps and the Wan 2.2 VAE's layout (16x spatial) at 256x256, 9 frames, 4 steps, guidance 5: on a CPU.",
        model="bench-wan22-ti2v-widths-v1", width=256, height=256, frames=9, fps=24, steps=4, guidance=5.0,
        videos=4, batch=2,
    ),
}

# Ad-copy style prompts: distinct texts, so the text cache helps only where a real run would repeat itself (the
# shared empty negative prompt).
SUBJECTS = ("a red sports car", "a golden retriever", "a city skyline", "a cup of coffee", "a mountain lake",
            "a running shoe", "a paper boat", "a neon sign")
SCENES = ("at sunrise", "in the rain", "in slow motion", "on a wooden table")


def prompts(count: int, model: str = "") -> list[str]:
    """`count` distinct prompts; for the toy model, prompts of its grammar (the quality sample set's)."""
    if model == "toy":
        return [case.prompt for case in sample_set(count)]
    return [f"{SUBJECTS[i % len(SUBJECTS)]} {SCENES[(i // len(SUBJECTS)) % len(SCENES)]}, take {i}"
            for i in range(count)]


# Measured on the toy model (docs/PERFORMANCE.md): single accelerators at the strengths that keep its outputs close,
# and combinations of them.
CANDIDATES = ("step_cache=0.1", "step_cache=0.2", "step_scale=0.75", "step_scale=0.5", "guidance_fraction=0.75",
              "step_scale=0.75,step_cache=0.1")
