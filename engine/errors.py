"""The engine's error tree. Each class carries its `decision` (faults.Decision): what the worker does with a video
whose render raised it (jobs.render.attempts.decide)."""

from typing import ClassVar

from faults import Decision


class EngineError(Exception):
    """Base of every error the engine raises on purpose: a refusal, which another attempt would meet again."""

    decision: ClassVar[Decision] = Decision.FAIL_NOW


class ModelNotFound(EngineError):
    """A manifest or task named a model the operator has not registered."""


class RenderError(EngineError):
    """The engine refuses the render (a shape it cannot make, a lossy setting without a passing gate, a picture on a
    model that takes none) or its output (non-finite or blank frames). Each is decided by the model, the settings and
    the request (its prompt and seed), which another attempt repeats: the video fails at once."""


class UnrenderableInput(RenderError):
    """The pipeline raised on the batch's inputs before its first denoising step was done (a ValueError of its
    input checks, or a RuntimeError such as `shape '[1, 256, 1, -1]' is invalid for input of size 640` from a side
    past the transformer's position table): decided by the shape and the model, so every attempt would raise it
    again. Out of memory and device errors are not this (engine.engine.Engine.render)."""


class RetryableRenderError(EngineError):
    """A render failed for a reason that may pass (out of memory, a device reset)."""

    decision: ClassVar[Decision] = Decision.RETRY


class RenderInterrupted(EngineError):
    """The caller asked the render to stop at a step boundary (run cancelled, time limit, lease lost). Not the
    video's failure: what follows depends on the reason (jobs.render.batch)."""

    decision: ClassVar[Decision] = Decision.HAND_BACK

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# What a RuntimeError says when the device, not the inputs, failed (a reset, a driver's or library's error): it may
# pass, so the engine retries it even before the first step (engine.engine.Engine.render).
# The CPU allocator's own ("DefaultCPUAllocator: not enough memory: you tried to allocate ...") is memory, too.
_DEVICE_WORDS = ("cuda", "cublas", "cudnn", "nccl", "hip error", "device-side", "out of memory", "not enough memory",
                 "cpuallocator", "can't allocate memory")


def device_error(exc: BaseException) -> bool:
    """Did the device fail (out of memory, a reset), rather than the inputs?"""
    import torch  # here: the error tree is read by code that never renders

    text = str(exc).lower()
    return isinstance(exc, torch.OutOfMemoryError) or any(word in text for word in _DEVICE_WORDS)
