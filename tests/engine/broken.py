"""Models broken the way users' models break, made from a loaded pipeline in place (and put back afterwards):

- proj_out: the transformer's output projection zeroed (a fine-tune saved with its head at zero, or a LoRA merge that
  cancelled it): the transformer outputs nothing, the latents stay the initial noise;
- blocks_zero: every transformer block's weights zeroed (a checkpoint whose blocks were saved empty);
- blocks_random: every block's layers back at their initial random weights (a checkpoint whose blocks did not load:
  PyTorch's own reset_parameters, what a model built from its config holds before loading);
- nan: one weight of the first block's feed-forward NaN (an overflowed half-precision conversion);
- vae_zero: the decoder zeroed (the VAE's, or a light decoder's where the registration has one).

engine.frames.video_checks and engine.loop.denoise.kept are judged on them in tests/engine/test_broken_models.py and
scripts/measure_broken.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

KINDS = ("proj_out", "blocks_zero", "blocks_random", "nan", "vae_zero")


def _modules(pipe, light_decoder, kind: str) -> list[torch.nn.Module]:
    transformers = [t for t in (pipe.transformer, getattr(pipe, "transformer_2", None)) if t is not None]
    if kind == "proj_out":
        return [t.proj_out for t in transformers]
    if kind in ("blocks_zero", "blocks_random"):
        return [t.blocks for t in transformers]
    if kind == "nan":
        return [t.blocks[0].ffn for t in transformers]
    if kind == "vae_zero":
        return [light_decoder if light_decoder is not None else pipe.vae.decoder]
    raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")


@contextlib.contextmanager
def broken(pipe, kind: str, light_decoder: torch.nn.Module | None = None, seed: int = 0) -> Iterator[None]:
    """`pipe` (and its light decoder) broken as `kind` says while the block runs; its weights put back after."""
    modules = _modules(pipe, light_decoder, kind)
    saved = [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]
    try:
        with torch.no_grad():
            for m in modules:
                _break(m, kind, seed)
        yield
    finally:
        with torch.no_grad():
            for m, state in zip(modules, saved):
                m.load_state_dict(state)


def _break(module: torch.nn.Module, kind: str, seed: int) -> None:
    if kind in ("proj_out", "blocks_zero", "vae_zero"):
        for p in module.parameters():
            p.zero_()
    elif kind == "blocks_random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for layer in module.modules():
                if layer is not module and hasattr(layer, "reset_parameters"):
                    layer.reset_parameters()
    elif kind == "nan":
        next(module.parameters()).view(-1)[0] = float("nan")
