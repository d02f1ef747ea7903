"""What a failure decides: the one value every error reelbatch raises on purpose carries, read by the worker.

A leaf below engine/, storage/ and jobs/ (it imports nothing of theirs), so that an engine error and a store error
can each say what their failure means without either importing the other, and the worker reads both the same way
(jobs.render.attempts.decide). dramatiq's Retry middleware is the model: what raises is retried unless the error says
otherwise.
"""

from __future__ import annotations

from enum import Enum


class Decision(Enum):
    """What a failed attempt of a video comes to."""

    # It may pass (an outage, out of memory, a time limit): back to pending after a backoff, spending an attempt;
    # past the last attempt the video fails.
    RETRY = "retry"
    # It will not pass however often it is tried (a different object at the key, a key too long for the store, a
    # render the engine refuses, blank frames from this model, prompt and seed): fail the video now, with the reason.
    FAIL_NOW = "fail now"
    # Not the video's failure (its render was stopped from outside: a cancel, a shutdown): give the unit back with
    # no attempt counted.
    HAND_BACK = "hand back"
