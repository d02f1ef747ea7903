"""Who is asking: every route's team, from `Authorization: Bearer SECRET` (RFC 6750). An unknown, revoked or
missing token is 401 with `WWW-Authenticate: Bearer`, and nothing is read or written for it. The secret is only
ever hashed (jobs.db.teams); it is never logged (uvicorn's access log has the request line, not its headers) and
never sent back."""

from __future__ import annotations

from fastapi import HTTPException, Request

from jobs.db.teams import TeamInfo, team_of_secret


def unauthorized(why: str) -> HTTPException:
    return HTTPException(401, detail=why, headers={"WWW-Authenticate": 'Bearer realm="reelbatch"'})


def caller(request: Request) -> TeamInfo:
    """The team of the request's bearer token (a FastAPI dependency)."""
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise unauthorized("send `Authorization: Bearer TOKEN` (see `reelbatch token create`)")
    team = team_of_secret(request.app.state.factory, secret.strip())
    if team is None:
        raise unauthorized("unknown or revoked token")
    return team
