"""Teams that share the fleet and their API tokens: add or change a team (share, quotas, output root), list them,
make a token (its secret returned once, only its hash kept), list and revoke tokens, and find the team a secret
names. What `reelbatch team|token` do and what every API request's authentication asks.

A team's output root is where its runs over the API may write: set by the operator (`team add|update --output`),
else the service's output (REELBATCH_OUTPUT) with the team's name as a prefix. The server decides, never the
client: a request's output must lie under it, compared in the canonical form of jobs.manifest.outputs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from jobs.db import teams
from jobs.db.connect import session_factory
from jobs.db.teams import KEEP, TeamInfo
from jobs.errors import UsageError
from jobs.manifest.outputs import canonical_output
from jobs.manifest.values import FieldError
from jobs.settings import Settings

# `team update --output default`: back to the service's output with the team's name as a prefix.
DEFAULT_OUTPUT = "default"


def add_team(settings: Settings, name: str, share: float = 1.0, max_gpus: int | None = None,
             monthly_usd: float | None = None, output: str | None = None) -> TeamInfo:
    """Add a team, or set an existing team's share and quotas (the same call again changes nothing); `output`, when
    given, its output root."""
    root = KEEP if output is None else _root(output)
    return teams.add_team(session_factory(settings.database_url), name, share, max_gpus, monthly_usd, root)


def update_team(settings: Settings, name: str, share: float | None = None, max_gpus: int | None = None,
                monthly_usd: float | None = None, output: str | None = None) -> TeamInfo:
    """Change what is given of an existing team (None: left as it is)."""
    given = {k: v for k, v in (("share", share), ("max_gpus", max_gpus), ("monthly_usd", monthly_usd))
             if v is not None}
    if output is not None:
        given["output"] = _root(output)
    return teams.update_team(session_factory(settings.database_url), name, **given)


def _root(output: str) -> str | None:
    if output == DEFAULT_OUTPUT:
        return None
    try:
        return canonical_output(output)
    except FieldError as exc:
        raise UsageError(f"--output: {exc}") from None


def output_root(settings: Settings, team: TeamInfo) -> str:
    """Where `team`'s runs may write, canonical and ending in '/'."""
    if team.output is not None:
        return team.output
    return canonical_output(settings.manifest.default_output or "file://./outputs/") + f"{team.name}/"


def allowed_outputs(settings: Settings) -> list[str] | None:
    """REELBATCH_ALLOWED_OUTPUTS in canonical form; None: unset (anywhere)."""
    allowed = settings.manifest.allowed_outputs
    return None if allowed is None else [canonical_output(a) for a in allowed]


def outside_allowed(settings: Settings, team: TeamInfo) -> str | None:
    """Why `team` could write outside the allowed outputs (a sentence naming the setting), or None."""
    allowed, root = allowed_outputs(settings), output_root(settings, team)
    if allowed is None:
        return ("REELBATCH_ALLOWED_OUTPUTS is not set, so a team could write anywhere: set it to the prefixes the "
                "teams' outputs lie under (docs/SERVICE.md)")
    if not any(root.startswith(prefix) for prefix in allowed):
        return (f"team {team.name}'s output {root} is not under REELBATCH_ALLOWED_OUTPUTS ({', '.join(allowed)}): "
                f"change one (`reelbatch team update {team.name} --output URI`)")
    return None


def unsafe_outputs(settings: Settings) -> str | None:
    """Why the service must not start (the first team that could write outside the allowed outputs), or None."""
    for team in list_teams(settings):
        why = outside_allowed(settings, team)
        if why is not None:
            return why
    return None


def team_settings(settings: Settings, team: TeamInfo) -> Settings:
    """The settings a request of `team` is checked with: its runs' output is its root or under it."""
    if outside_allowed(settings, team) is not None:  # changed since `serve` started: refused, not widened
        raise UsageError(f"team {team.name}'s output root is outside the service's allowed outputs: ask the "
                         "operator to change it (`reelbatch team update`)")
    root = output_root(settings, team)
    return dataclasses.replace(settings, manifest=dataclasses.replace(
        settings.manifest, allowed_outputs=(root,), default_output=root))


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
