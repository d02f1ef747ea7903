"""Chunk planning, stitching and the seam score: plain arithmetic, checked as tables."""

import numpy as np
import pytest
import torch

from engine.long.chunks import chunk_seed, plan
from engine.long.stitch import seam_score, stitch


@pytest.mark.parametrize("frames, window, overlap, t, chunks, latents, seams", [
    # Within the window: one chunk, no seam.
    (9, 9, 2, 2, 1, 5, []),
    (5, 9, 2, 2, 1, 3, []),
    (81, 81, 2, 4, 1, 21, []),
    # The toy model (window 9 frames = 5 latents, stride 3 latents; latent j >= 1 holds frames 2j-1 and 2j):
    # 4x the window's second is 33 frames; each later chunk's own frames begin 6 frames after the last's.
    (33, 9, 2, 2, 5, 17, [9, 15, 21, 27]),
    (11, 9, 2, 2, 2, 6, [9]),  # one latent past the window: a whole second chunk, then cut to the video
    (15, 9, 2, 2, 2, 8, [9]),
    (17, 9, 2, 2, 3, 9, [9, 15]),  # 9 latents need 5 + 3 + 1: the last chunk renders whole and is cut
    # Wan (81 frames = 21 latents), 2 latents (8 frames) of overlap: 10 s at 16 fps is 161 frames.
    (161, 81, 2, 4, 3, 41, [81, 157]),
    (321, 81, 2, 4, 5, 81, [81, 157, 233, 309]),
])
def test_plans(frames, window, overlap, t, chunks, latents, seams):
    p = plan(frames, window, overlap, t)
    assert (p.chunks, p.latents, p.seams()) == (chunks, latents, seams)
    # Every chunk is a whole window, and together they cover the video.
    assert p.start(p.chunks - 1) + p.window_latents >= p.latents
    assert p.chunks == 1 or p.start(p.chunks - 2) + p.window_latents < p.latents, "no chunk beyond the need"


@pytest.mark.parametrize("frames, window, overlap, message", [
    (10, 9, 2, "frames 10 is not 2k\\+1"),
    (33, 8, 2, "window 8 is not 2k\\+1"),
    (33, 9, 5, "overlap 5 latents must be between 1 and 4"),
    (33, 9, 0, "overlap 0 latents must be between 1 and 4"),
])
def test_bad_plans_say_what_is_wrong(frames, window, overlap, message):
    with pytest.raises(ValueError, match=message):
        plan(frames, window, overlap, 2)


def test_stitch_keeps_the_first_chunk_crossfades_the_overlap_and_cuts_to_length():
    p = plan(15, 9, 2, 2)  # 8 latents from two chunks of 5, overlapping by 2
    a = torch.zeros(1, 5, 2, 2)
    b = torch.ones(1, 5, 2, 2)
    video = stitch([a, b], p)
    assert video.shape == (1, 8, 2, 2)
    per_frame = video[0, :, 0, 0].tolist()
    assert per_frame == pytest.approx([0, 0, 0, 1 / 3, 2 / 3, 1, 1, 1])
    with pytest.raises(ValueError, match="2 chunks given, the plan has 5"):
        stitch([a, b], plan(33, 9, 2, 2))


def test_seam_score_is_about_one_for_steady_motion_and_high_for_a_jump():
    frames = np.zeros((17, 8, 8, 3), dtype=np.uint8)
    for i in range(17):
        frames[i] = i * 5  # a steady fade: every step alike
    assert seam_score(frames, [11]) == pytest.approx(1.0)
    frames[11:] += 60  # the picture jumps where the second chunk's own frames begin
    assert seam_score(frames, [11]) > 5
    assert seam_score(frames, []) is None


def test_each_chunk_after_the_first_draws_its_own_seed():
    """Chunk 0 keeps the video's seed, so a one-window video renders as before; later chunks get seeds of their
    own, stable across processes (no hash()) and different per video."""
    assert chunk_seed(1234, 0) == 1234
    seeds = [chunk_seed(1234, k) for k in range(1, 64)]
    assert len(set(seeds + [1234])) == 64 and all(0 <= s < 2**63 for s in seeds)
    assert chunk_seed(1234, 1) == 0x52A4B13A0C99B66C  # sha256("1234\\x001")[:8], top bit cleared
    assert chunk_seed(1235, 1) != chunk_seed(1234, 1)
    # The noise a chunk starts from is then its own: with the video's seed in every chunk it was chunk 0's.
    noise = [torch.randn(4, generator=torch.Generator().manual_seed(chunk_seed(7, k))) for k in range(3)]
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[1], noise[2])


@pytest.mark.parametrize("clean", [False, True])
def test_the_tie_holds_the_overlap_noised_to_each_step_or_clean(model_cache, clean):
    """What the transformer sees of a conditioned chunk's overlap at every step: the condition noised to the step's
    level with the chunk's own initial noise (chunk_condition noised), or the condition itself (clean); the free
    video in the same batch is left alone, and the overlap comes out equal to the condition either way. Held clean,
    the overlap's tokens get timestep 0 and every other token the step's."""
    from engine.engine import Engine
    from engine.levers.config import EngineConfig
    from engine.loop import denoise
    from engine.loop.conditioning import Conditioning
    from engine.loop.guidance import Guidance
    from engine.models.registry import Registry

    pipe = Engine(EngineConfig(cache_dir=model_cache), Registry()).pipeline("tiny")
    embeds = pipe.encode_prompt(["a", "b"], do_classifier_free_guidance=False, max_sequence_length=64)[0]
    condition = torch.randn(16, 2, 8, 8, generator=torch.Generator().manual_seed(1))
    seen, timesteps = [], []

    def record(module, args, kwargs):
        seen.append(kwargs["hidden_states"][:, :, :2].clone())
        timesteps.append(kwargs["timestep"].clone())

    hook = pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        latents = denoise.denoise(pipe, prompt_embeds=embeds, negative_prompt_embeds=None, height=64, width=64,
                                  frames=9, steps=3, guidance=Guidance(1.0),
                                  conditioning=Conditioning(conditions=[condition, None], clean_condition=clean),
                                  generators=[torch.Generator().manual_seed(s) for s in (5, 6)])
    finally:
        hook.remove()
    noise = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(5))[:, :2]
    sigmas = pipe.scheduler.sigmas
    assert len(seen) == 3
    for i, overlap in enumerate(seen):
        expected = condition if clean else (1 - sigmas[i]) * condition + sigmas[i] * noise
        assert torch.allclose(overlap[0], expected, atol=1e-5), i
        assert not torch.allclose(overlap[1], expected, atol=1e-2)
    per_frame = 4 * 4  # 8x8 latents in 2x2 patches
    for t, step in zip(timesteps, pipe.scheduler.timesteps):
        if clean:  # (videos, tokens) in frame-major order; the overlap is the first 2 latent frames
            assert t.shape == (2, 3 * per_frame)
            assert torch.all(t[0, : 2 * per_frame] == 0) and torch.all(t[0, 2 * per_frame :] == step)
            assert torch.all(t[1] == step)
        else:
            assert t.shape == (2,) and torch.all(t == step)
    assert torch.equal(latents[0, :, :2], condition)
