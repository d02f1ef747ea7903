"""Teams that share the fleet and their API tokens: add or change a team (share, quotas), list them, make a token
(its secret returned once, only its hash kept), list and revoke tokens, and find the team a secret names. What
`reelbatch team|token` do and what every API request's authentication asks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobs.db import teams
from jobs.db.connect import session_factory
from jobs.db.teams import TeamInfo
from jobs.settings import Settings


def add_team(settings: Settings, name: str, share: float = 1.0, max_gpus: int | None = None,
             monthly_usd: float | None = None) -> TeamInfo:
    """Add a team, or set an existing team's share and quotas (the same call again changes nothing)."""
    return teams.add_team(session_factory(settings.database_url), name, share, max_gpus, monthly_usd)


def list_teams(settings: Settings) -> list[TeamInfo]:
    return teams.list_teams(session_factory(settings.database_url))


@dataclass(frozen=True)
class NewToken:
    id: int
    team: str
    secret: str  # shown once: only its SHA-256 is stored


def create_token(settings: Settings, team: str) -> NewToken:
    token_id, secret = teams.create_token(session_factory(settings.database_url), team)
    return NewToken(token_id, team, secret)


@dataclass(frozen=True)
class Token:
    id: int
    team: str
    created_at: datetime
    revoked_at: datetime | None

    def as_dict(self) -> dict:
        return {"id": self.id, "team": self.team, "created_at": self.created_at.isoformat(),
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None}


def list_tokens(settings: Settings) -> list[Token]:
    """Every token's id, team, creation and revocation (never a secret)."""
    return [Token(t.id, t.team, t.created_at, t.revoked_at)
            for t in teams.list_tokens(session_factory(settings.database_url))]


def revoke_token(settings: Settings, token_id: int) -> bool:
    """Requests bearing it are refused from now on. False when it was revoked already."""
    return teams.revoke_token(session_factory(settings.database_url), token_id)


def team_of_secret(settings: Settings, secret: str) -> TeamInfo | None:
    """The team a bearer secret names; None for an unknown or revoked one."""
    return teams.team_of_secret(session_factory(settings.database_url), secret)
