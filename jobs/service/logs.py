"""uvicorn's logging for `reelbatch serve`, its access log with no secret in it. A token belongs in the
Authorization header, which the access log never shows; but a client may also put one in the URL (`?token=...`,
a path segment). So each access line keeps the request's path and its query's keys, never a query value, and any
token-shaped text (jobs.db.teams.PREFIX, then URL-safe base64) in the path is replaced."""

from __future__ import annotations

import copy
import logging
import re

from uvicorn.config import LOGGING_CONFIG

_TOKEN = re.compile(r"rb_[A-Za-z0-9_-]+")
HIDDEN = "[hidden]"


def redact(target: str) -> str:
    """A request target as the access log may show it."""
    path, sep, query = target.partition("?")
    path = _TOKEN.sub(HIDDEN, path)
    if not sep:
        return path
    keys = (_TOKEN.sub(HIDDEN, part.partition("=")[0]) for part in query.split("&") if part)
    return path + "?" + "&".join(f"{key}={HIDDEN}" for key in keys)


class Redact(logging.Filter):
    """On uvicorn.access's records, whose args are (client, method, target, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, target, version, status = record.args
            record.args = (client, method, redact(str(target)), version, status)
        return True


def log_config() -> dict:
    """uvicorn's own logging configuration with Redact on its access handler."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact"] = {"()": Redact}
    config["handlers"]["access"]["filters"] = ["redact"]
    return config
