"""Stopping a render at a step: the engine's caller (the worker, jobs.render.keeper) passes `should_stop`, asked after
every denoising step; a reason it returns stops the render with RenderInterrupted. Both loops ask it the same way:
the engine's own (engine.loop.denoise) and, for a pipeline that loop does not support, diffusers' callback."""

from __future__ import annotations

from collections.abc import Callable

from engine.errors import RenderInterrupted

ShouldStop = Callable[[], str | None]


def check(should_stop: ShouldStop | None) -> None:
    """RenderInterrupted with the reason `should_stop` gives, if it gives one."""
    if should_stop is not None and (reason := should_stop()):
        raise RenderInterrupted(reason)


def on_step_end(should_stop: ShouldStop):
    """The same check as diffusers' `callback_on_step_end`."""
    def callback(pipe, step, timestep, callback_kwargs):
        check(should_stop)
        return callback_kwargs

    return callback
