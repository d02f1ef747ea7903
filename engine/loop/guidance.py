"""Classifier-free guidance in the engine's loop (engine.loop.denoise): the scales, how the two passes run, and on which
steps.

diffusers runs the conditional and the unconditional pass as two transformer calls per step. Stacking them into one
call of twice the batch (`batched`) does the same arithmetic with half the kernel launches and weight reads, which
matters most for small clips, where each call is too small to fill the device. Unbatched this is WanPipeline's step
op for op (bit-identical output, tested); batched, matmuls of another batch size may round differently in the last
bit, which the quality gate measures (PSNR against the reference renders).

`steps` (a lossy accelerator, off by default and accepted by a run only behind a recorded quality gate, jobs.gates)
runs guidance on the first steps only, where layout and colour are decided (the rest take the conditional pass
alone: half their transformer work), after "Applying guidance in a limited interval" (Kynkaanniemi et al., 2024).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine import parallel


@dataclass(frozen=True)
class Guidance:
    """A batch's guidance: `scale` (the manifest's, the high-noise expert's on Wan 2.2 A14B), `scale_2` (the
    low-noise expert's; None: the first scale, WanPipeline's default), both passes in one call (`batched`), and
    guidance on the first `steps` steps only (None: all of them)."""

    scale: float
    scale_2: float | None = None
    batched: bool = True
    steps: int | None = None

    @property
    def on(self) -> bool:
        """WanPipeline.do_classifier_free_guidance: the first scale decides for both experts."""
        return self.scale > 1.0

    def at(self, step: int) -> bool:
        """Whether step `step` (from 0) is guided."""
        return self.on and (self.steps is None or step < self.steps)


@dataclass(frozen=True)
class Prompts:
    """The text a step's passes read, on the device in the transformer's dtype: the prompts, the negative prompts
    when guidance is on, and both stacked (prompts first) when the passes are batched."""

    cond: torch.Tensor
    uncond: torch.Tensor | None
    both: torch.Tensor | None


def prompts(guidance: Guidance, prompt_embeds: torch.Tensor, negative_prompt_embeds: torch.Tensor | None,
            device: torch.device, dtype: torch.dtype) -> Prompts:
    cond = prompt_embeds.to(device, dtype)
    uncond = None
    if guidance.on:
        if negative_prompt_embeds is None:
            raise ValueError(f"guidance {guidance.scale} needs negative prompt embeddings")
        uncond = negative_prompt_embeds.to(device, dtype)
    return Prompts(cond, uncond, torch.cat([cond, uncond]) if guidance.on and guidance.batched else None)


# (name of the kind of call, hidden states, text) -> the transformer's prediction. The name keys a step cache's
# state (diffusers' cache_context): one per kind of call.
Run = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]


def prediction(run: Run, guidance: Guidance, step: int, scale: float, x: torch.Tensor, text: Prompts) -> torch.Tensor:
    """The step's noise prediction, as WanPipeline.__call__ forms it: the conditional pass, and where the step is
    guided the unconditional one and `uncond + scale * (cond - uncond)`."""
    guide = guidance.at(step)
    halves = parallel.cfg_half() if guide else None
    if halves is not None:  # CFG parallel: this rank's pass; the other half's gathered (engine.parallel)
        group, half = halves
        assert text.uncond is not None  # guide implies guidance.on, so prompts() made them
        local = run("uncond", x, text.uncond) if half else run("cond", x, text.cond)
        noise_pred, noise_uncond = parallel.gather_halves(local, group)
    elif guide and text.both is not None:
        noise_pred, noise_uncond = run("both", torch.cat([x, x]), text.both).chunk(2)
    else:
        noise_pred = run("cond", x, text.cond)
        if guide:
            assert text.uncond is not None  # guide implies guidance.on, so prompts() made them
            noise_uncond = run("uncond", x, text.uncond)
    if guide:
        noise_pred = noise_uncond + scale * (noise_pred - noise_uncond)
    return noise_pred
