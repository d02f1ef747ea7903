"""What the service refuses before it does any work: a request body over `max_body_bytes` (413), and a team's
submissions, estimates or changes (cancel, resume, budget) past their limits a minute (429 with Retry-After). Neither
records anything."""

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


class Rates:
    """Per team and kind of request, at most `limits[kind]` requests in any 60 seconds (a sliding window, in this
    process: run one `serve` per database, or put the limits in the proxy too). A refused one says when the next is
    allowed and which `serve` option sets the limit. The kinds are what costs the service time: a submission (a
    manifest recorded and queued), an estimate (a manifest checked and priced, as long as a submission's checks) and a
    change (cancel, resume, budget: one statement over a run's videos)."""

    WINDOW_S = 60.0
    OPTIONS = {"submissions": "--submits-per-minute", "estimates": "--estimates-per-minute",
               "changes": "--changes-per-minute"}

    def __init__(self, limits: dict[str, int], clock=time.monotonic) -> None:
        unknown = set(limits) - set(self.OPTIONS)
        if unknown:
            raise ValueError(f"unknown kinds of request: {sorted(unknown)}")
        self.limits, self.clock = dict(limits), clock
        self._seen: dict[tuple[int, str], deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, team: TeamInfo, kind: str) -> None:
        limit, now = self.limits[kind], self.clock()
        with self._lock:
            seen = self._seen.setdefault((team.id, kind), deque())
            while seen and seen[0] <= now - self.WINDOW_S:
                seen.popleft()
            if len(seen) >= limit:
                wait = max(1, math.ceil(seen[0] + self.WINDOW_S - now))
                raise HTTPException(429, detail=f"team {team.name}: over {limit} {kind} a minute "
                                                f"(serve {self.OPTIONS[kind]}); retry in {wait} s",
                                    headers={"Retry-After": str(wait)})
            seen.append(now)
