"""engine.adapters.light_decoder's clip-wide context: every frame reads latent 0 (where Wan's causal VAE codes the first
frame alone), nothing reads a later latent, and a folder saved without the field loads as before."""

import json

import torch

from engine.adapters import light_decoder
from engine.adapters.light_decoder import DecoderConfig, LightDecoder


def decoder(context: bool) -> LightDecoder:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LightDecoder(DecoderConfig(8, 4, 2, (16, 8, 8), context=context)).eval()


def decode_pair(d: LightDecoder, change: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames of 5 latents (9 frames: latent 0 is frame 0, latent k frames 2k-1 and 2k), and of the same latents
    with those in `change` replaced."""
    z = torch.randn(2, 8, 5, 8, 8, generator=torch.Generator().manual_seed(1))
    other = z.clone()
    other[:, :, change] = torch.randn(other[:, :, change].shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return d(z), d(other)


def moved(a: torch.Tensor, b: torch.Tensor) -> list[bool]:
    """Per frame, whether any pixel differs."""
    return [bool((a[:, :, f] != b[:, :, f]).any()) for f in range(a.shape[2])]


def test_with_context_the_last_frame_reads_latent_0_and_without_it_does_not():
    # Without the context a frame reads its latent and, through one memory block per resolution, a latent and two
    # frames back: frames 5-8 (latents 3 and 4) are out of latent 0's reach.
    a, b = decode_pair(decoder(False), slice(0, 1))
    assert moved(a, b) == [True, True, True, True, True, False, False, False, False]
    a, b = decode_pair(decoder(True), slice(0, 1))
    assert moved(a, b) == [True] * 9


def test_the_context_is_causal():
    a, b = decode_pair(decoder(True), slice(3, 5))  # latents 3 and 4: frames 5-8
    assert moved(a, b) == [False] * 5 + [True] * 4


def test_a_folder_keeps_its_context_and_one_saved_before_it_loads_without(tmp_path):
    light_decoder.save(decoder(True), tmp_path / "new")
    loaded = light_decoder.load(tmp_path / "new")
    assert loaded.config.context is True
    a, _ = decode_pair(decoder(True), slice(0, 1))
    b, _ = decode_pair(loaded, slice(0, 1))
    assert torch.equal(a, b)
    light_decoder.save(decoder(False), tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["context"]  # as folders written before the field existed
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    assert light_decoder.load(tmp_path / "old").config.context is False
