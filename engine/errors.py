"""The engine's error tree. The worker reads `retryable` to decide whether a failure is worth another attempt."""


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""

    retryable = False


class ModelNotFound(EngineError):
    """A manifest or task named a model the operator has not registered."""


class RenderError(EngineError):
    """A render finished but its output is unusable (non-finite or blank frames)."""


class RetryableRenderError(EngineError):
    """A render failed for a reason that may pass (out of memory, a device reset)."""

    retryable = True


class RenderInterrupted(EngineError):
    """The caller asked the render to stop at a step boundary (run cancelled, time limit, lease lost)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
