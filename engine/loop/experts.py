"""A two-expert pipeline's experts: which one runs each step (Stages), and keeping the idle one in CPU memory
(ModelInfo.offload_idle_expert).

Wan2.2-T2V-A14B runs a high-noise transformer for the early steps and a low-noise one after the boundary; each is
14B parameters, 28 GB in bf16, so the pair needs 57 GB of device memory before any activations. Only one runs at a
time, so the idle one can wait in CPU memory and be swapped in at the boundary: every batch then moves one expert in
at the boundary and the other back in at the next batch's first step, 2 x 28 GB per batch, whatever its size.

Each expert's weights stay where loading put them (the CPU) until its first swap, which copies them once into
pinned memory where the device is CUDA (so a copy to the device runs at the bus's speed, without a staging copy).
Taken then, not at load, the copy holds whatever loading did to the weights after the swap was set up (adapters
fused in, for one). Evicting an expert copies nothing back: its parameters point at their CPU copies again and the
device copies are freed, as diffusers' group offloading does (weights never change while rendering). On a machine
without an accelerator the device is the CPU and a swap moves nothing; `moves` still records each swap, in order,
with its seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.loop.guidance import Guidance

log = logging.getLogger(__name__)


def experts(pipe) -> list[torch.nn.Module]:
    """The pipeline's transformers: one, or the high-noise and the low-noise expert."""
    return [m for m in (pipe.transformer, getattr(pipe, "transformer_2", None)) if m is not None]


@dataclass(frozen=True)
class Stages:
    """Which expert runs a step of the engine's loop (engine.loop.denoise), at which guidance scale, as
    WanPipeline.__call__ picks them: on Wan 2.2 A14B `transformer` while the timestep is at or above `boundary`
    (boundary_ratio x num_train_timesteps) with the first scale, `transformer_2` below it with the second; on a
    one-transformer model (no boundary) `transformer` at every step. `activate` (ExpertSwap.activate) is called with
    each step's expert before it runs."""

    high: torch.nn.Module
    low: torch.nn.Module | None
    boundary: float | None
    scale: float
    scale_2: float
    activate: Callable[[torch.nn.Module], None] | None = None

    def at(self, t: torch.Tensor) -> tuple[torch.nn.Module, float]:
        """The expert for timestep `t`, activated, and its scale."""
        if self.boundary is None or t >= self.boundary:  # Wan 2.1, or Wan 2.2's high-noise stage
            model, scale = self.high, self.scale
        else:  # Wan 2.2's low-noise stage
            model, scale = self.low, self.scale_2
        if self.activate is not None:
            self.activate(model)
        return model, scale


def stages(pipe, guidance: Guidance, activate: Callable[[torch.nn.Module], None] | None = None) -> Stages:
    """The pipeline's stages for a batch, with the registration's `guidance_2` on the low-noise one (the pipeline's
    default for it: the first scale). Resets each expert's step cache (diffusers' hooks keep state per named call,
    per expert), as every batch starts one."""
    for model in experts(pipe):
        if getattr(model, "is_cache_enabled", False):
            model._reset_stateful_cache()
    if pipe.config.boundary_ratio is None:
        return Stages(pipe.transformer, None, None, guidance.scale, guidance.scale, activate)
    boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
    scale_2 = guidance.scale if guidance.scale_2 is None else guidance.scale_2
    return Stages(pipe.transformer, pipe.transformer_2, boundary, guidance.scale, scale_2, activate)


class ExpertSwap:
    """Keeps one of a pipeline's two experts on `device` and the other in CPU memory; `activate` swaps them."""

    def __init__(self, pipe, device: torch.device):
        self.device = device
        self.names = {id(pipe.transformer): "transformer", id(pipe.transformer_2): "transformer_2"}
        # id(expert) -> [(tensor, its CPU copy)] for every parameter and buffer, taken at the expert's first swap.
        self._copies: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.active: torch.nn.Module | None = None
        # (expert name, seconds) for each expert brought to the device, in order.
        self.moves: list[tuple[str, float]] = []

    def activate(self, module: torch.nn.Module) -> None:
        """Make `module` the expert on the device (evicting the other first, so both never hold device memory)."""
        if module is self.active:
            return
        start = time.perf_counter()
        if self.active is not None:
            self._evict(self.active)
        # Plain tensors even inside the render's inference_mode: they are parameters for the process's life.
        with torch.inference_mode(False), torch.no_grad():
            for tensor, copy in self._cpu_copies(module):
                tensor.data = copy.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.active = module
        seconds = time.perf_counter() - start
        self.moves.append((self.names[id(module)], seconds))
        log.info("expert %s to %s in %.2f s", self.names[id(module)], self.device, seconds)

    def _evict(self, module: torch.nn.Module) -> None:
        for tensor, copy in self._cpu_copies(module):
            tensor.data = copy

    def _cpu_copies(self, module: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if id(module) not in self._copies:
            with torch.inference_mode(False), torch.no_grad():
                self._copies[id(module)] = [(t, _cpu_copy(t, pin=self.device.type == "cuda"))
                                            for t in _tensors(module)]
        return self._copies[id(module)]


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def _cpu_copy(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    """The tensor's CPU copy: its own storage where it is already unpinned on the CPU (nothing to copy)."""
    copy = tensor.detach().cpu()
    return copy.pin_memory() if pin else copy
