"""What the service refuses before it does any work: a request body over `max_body_bytes` (413), and a team's
submissions past `submits_per_minute` (429 with Retry-After). Neither records anything."""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from fastapi import HTTPException

from jobs.db.teams import TeamInfo


class BodyLimit:
    """ASGI middleware: the request body is read here, up to `max_bytes`, before any route runs; one over it (by its
    Content-Length, or by what arrives when it is sent in chunks) is answered 413 without being read further."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _too_large(send, self.max_bytes)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await _too_large(send, self.max_bytes)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _too_large(send, max_bytes: int) -> None:
    body = (f'{{"detail": "the request body is over the {max_bytes:,}-byte limit (serve --max-body-bytes); '
            f'split the manifest into several runs"}}').encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class SubmitRate:
    """At most `per_minute` submissions a team in any 60 seconds (a sliding window, in this process: run one
    `serve` per database, or put the limit in the proxy too). A refused one says when the next is allowed."""

    WINDOW_S = 60.0

    def __init__(self, per_minute: int, clock=time.monotonic) -> None:
        self.per_minute, self.clock = per_minute, clock
        self._seen: dict[int, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, team: TeamInfo) -> None:
        now = self.clock()
        with self._lock:
            seen = self._seen.setdefault(team.id, deque())
            while seen and seen[0] <= now - self.WINDOW_S:
                seen.popleft()
            if len(seen) >= self.per_minute:
                wait = max(1, math.ceil(seen[0] + self.WINDOW_S - now))
                raise HTTPException(429, detail=f"team {team.name}: over {self.per_minute} submissions a minute "
                                                f"(serve --submits-per-minute); retry in {wait} s",
                                    headers={"Retry-After": str(wait)})
            seen.append(now)
