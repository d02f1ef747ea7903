"""What `reelbatch bench` renders: its presets (a model and a shape, with why each exists) and prompts. Plain values,
so the CLI can list them without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.quality.sample import sample_set


@dataclass(frozen=True)
class Preset:
    name: str
    why: str
    model: str  # a bench model built into the cache (engine.bench_models), or "tiny"
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
    # The registration reelbatch's side renders instead of `model`, at its own registered steps and guidance (the
    # baseline keeps `model` at the preset's): a bench model with a random-weight LoRA, sampler and light decoder
    # (engine.bench_models.FAST). `reelbatch bench --model NAME` sets it for any preset.
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
