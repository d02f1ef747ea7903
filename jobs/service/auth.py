"""Who is asking: every route's team, from `Authorization: Bearer SECRET` (RFC 6750). An unknown, revoked or
missing token is 401 with `WWW-Authenticate: Bearer`, and nothing is read or written for it.

The token is checked from the headers alone, by the outermost middleware (Authenticate), before a byte of the body
is read: a client without a valid token cannot make the server hold its upload (the body limit, jobs.service.guards,
runs inside it). The secret is only ever hashed (jobs.db.teams); it is never logged (jobs.service.logs keeps it out
of the access log wherever a client puts it) and never sent back."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from jobs.db.teams import TeamInfo, team_of_secret

CHALLENGE = 'Bearer realm="reelbatch"'
NO_TOKEN = "send `Authorization: Bearer TOKEN` (see `reelbatch token create`)"
BAD_TOKEN = "unknown or revoked token"
# Described in the OpenAPI file as the one security scheme; the check itself is Authenticate's.
scheme = HTTPBearer(auto_error=False, description="A team's token: `reelbatch token create --team NAME`.")


def unauthorized(why: str) -> HTTPException:
    return HTTPException(401, detail=why, headers={"WWW-Authenticate": CHALLENGE})


def _secret(header: str) -> str | None:
    kind, _, secret = header.partition(" ")
    return secret.strip() if kind.lower() == "bearer" and secret.strip() else None


class Authenticate:
    """ASGI middleware: a /v1/ request's team is found from its headers and put in the request's state; without one
    the answer is 401 at once, with `Connection: close`, the body never read."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        secret = _secret(Headers(scope=scope).get("authorization", ""))
        team = None if secret is None else await run_in_threadpool(
            team_of_secret, scope["app"].state.factory, secret)
        if team is None:
            body = json.dumps({"detail": NO_TOKEN if secret is None else BAD_TOKEN}).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", CHALLENGE.encode()), (b"connection", b"close")]})
            return await send({"type": "http.response.body", "body": body})
        scope.setdefault("state", {})["team"] = team
        return await self.app(scope, receive, send)


def caller(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(scheme)] = None) -> TeamInfo:
    """The team of the request's bearer token (a FastAPI dependency): Authenticate's finding."""
    team = getattr(request.state, "team", None)
    if team is not None:
        return team
    secret = _secret(request.headers.get("authorization", ""))  # a route outside /v1/ that asks for a team
    team = None if secret is None else team_of_secret(request.app.state.factory, secret)
    if team is None:
        raise unauthorized(NO_TOKEN if secret is None else BAD_TOKEN)
    return team
