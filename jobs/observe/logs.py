"""Structured logs: one JSON object per line when asked (`reelbatch worker --log-format json`), with the batch in
hand bound to every record (its runs, videos and work units), so a log search finds everything about one video."""

from __future__ import annotations

import contextvars
import json
import logging
from contextlib import contextmanager
from datetime import datetime, timezone

_bound: contextvars.ContextVar[dict] = contextvars.ContextVar("reelbatch_log_context", default={})


@contextmanager
def bound(**fields):
    """Add `fields` (e.g. run=..., videos=[...]) to every record logged inside the block, on this thread."""
    token = _bound.set({**_bound.get(), **fields})
    try:
        yield
    finally:
        _bound.reset(token)


def current() -> dict:
    return dict(_bound.get())


def current_context() -> contextvars.Context:
    """A copy of this thread's context, to run work on another thread (the finisher) with the same bound fields."""
    return contextvars.copy_context()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                 "process": record.process, "thread": record.threadName, **_bound.get()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def use_json(logger: logging.Logger | None = None) -> None:
    """Every handler of `logger` (default: the root logger) writes JSON lines."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter())
