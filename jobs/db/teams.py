"""Teams and their API tokens in the database: a team is added with its share and quotas, a token is made for it
(the secret returned once, only its SHA-256 kept) and revoked; a request's token names its team; a run belongs to
one team, and a team finds only its own runs (another team's run is "not found", exactly as a run that does not
exist, so a token cannot learn what other teams run).

The default team (DEFAULT) owns what the CLI records, and every run recorded before teams existed (team_id NULL
reads as it)."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from jobs.db.base import utcnow
from jobs.db.queries import Factory, _run_id
from jobs.db.rows import CostRecord, Run, Video
from jobs.db.service_rows import Team, Token
from jobs.db.status import Status
from jobs.db.submission import DEFAULT_TEAM, default_team_id
from jobs.errors import RunNotFound, UsageError

DEFAULT = DEFAULT_TEAM
# A token's secret: 32 random bytes (256 bits, as RFC 6750 leaves the size to us) in URL-safe base64, after a prefix
# that says what it is, so a leaked one is easy to find in a log or a repository.
PREFIX = "rb_"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class TeamInfo:
    id: int
    name: str
    share: float
    max_gpus: int | None
    monthly_usd: float | None
    default: bool
    output: str | None = None  # its output root, canonical; None: the service's output + its name

    @property
    def owns(self):
        """The where-clause for this team's runs."""
        return owns(self.id, self.default)


def owns(team_id: int, default: bool):
    return or_(Run.team_id == team_id, Run.team_id.is_(None)) if default else Run.team_id == team_id


def _info(t: Team) -> TeamInfo:
    return TeamInfo(t.id, t.name, t.share, t.max_gpus,
                    None if t.monthly_micro_usd is None else t.monthly_micro_usd / 1e6, t.name == DEFAULT,
                    t.output)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


# `output` left as it is (add_team, update_team); an output of None is the default root.
KEEP = object()


def add_team(factory: Factory, name: str, share: float = 1.0, max_gpus: int | None = None,
             monthly_usd: float | None = None, output: str | None | object = KEEP) -> TeamInfo:
    """Add a team, or change an existing one's share and quotas (the same command again is a no-op). `output` (a
    canonical output URI, None for the default): set when given, else left as it is."""
    if not _NAME.match(name):
        raise UsageError(f"team name {name!r}: use 1-64 lower-case letters, digits, '-' or '_', starting with a "
                         "letter or digit")
    _check_limits(share, max_gpus, monthly_usd)
    with factory.begin() as s:
        team = s.scalar(select(Team).where(Team.name == name))
        if team is None:
            team = Team(name=name)
            s.add(team)
        team.share, team.max_gpus = share, max_gpus
        team.monthly_micro_usd = None if monthly_usd is None else round(monthly_usd * 1e6)
        if output is not KEEP:
            team.output = output
        s.flush()
        return _info(team)


def update_team(factory: Factory, name: str, share: float | object = KEEP, max_gpus: int | None | object = KEEP,
                monthly_usd: float | None | object = KEEP, output: str | None | object = KEEP) -> TeamInfo:
    """Change what is given of an existing team (KEEP: left as it is)."""
    with factory.begin() as s:
        team = find_team(s, name, "team")
        now = _info(team)
        _check_limits(*(now_ if new is KEEP else new for now_, new in
                        ((now.share, share), (now.max_gpus, max_gpus), (now.monthly_usd, monthly_usd))))
        if share is not KEEP:
            team.share = share
        if max_gpus is not KEEP:
            team.max_gpus = max_gpus
        if monthly_usd is not KEEP:
            team.monthly_micro_usd = None if monthly_usd is None else round(monthly_usd * 1e6)
        if output is not KEEP:
            team.output = output
        s.flush()
        return _info(team)


def _check_limits(share, max_gpus, monthly_usd) -> None:
    if not share > 0:
        raise UsageError(f"--share {share!r}: must be above 0")
    if max_gpus is not None and max_gpus < 0:
        raise UsageError(f"--max-gpus {max_gpus!r}: must be 0 or more")
    if monthly_usd is not None and monthly_usd < 0:
        raise UsageError(f"--monthly-usd {monthly_usd!r}: must be 0 or more")


def list_teams(factory: Factory) -> list[TeamInfo]:
    with factory.begin() as s:
        default_team_id(s)
        return [_info(t) for t in s.scalars(select(Team).order_by(Team.id))]


def find_team(s: Session, name: str, named_by: str = "--team") -> Team:
    team = s.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise UsageError(f"{named_by} {name!r}: no such team (see `reelbatch team list`)")
    return team


def create_token(factory: Factory, team: str) -> tuple[int, str]:
    """A new token for `team`: (its id, its secret). The secret is returned here once and never stored."""
    secret = PREFIX + secrets.token_urlsafe(32)
    with factory.begin() as s:
        token = Token(team_id=find_team(s, team).id, secret_sha256=secret_hash(secret))
        s.add(token)
        s.flush()
        return token.id, secret


@dataclass(frozen=True)
class TokenInfo:
    id: int
    team: str
    created_at: datetime
    revoked_at: datetime | None


def list_tokens(factory: Factory) -> list[TokenInfo]:
    with factory() as s:
        rows = s.execute(select(Token, Team.name).join(Team, Team.id == Token.team_id).order_by(Token.id)).all()
    return [TokenInfo(t.id, name, t.created_at, t.revoked_at) for t, name in rows]


def revoke_token(factory: Factory, token_id: int) -> bool:
    """Revoke a token; True if it was live until now (revoking it again is a no-op)."""
    with factory.begin() as s:
        token = s.get(Token, token_id)
        if token is None:
            raise UsageError(f"no token {token_id} (see `reelbatch token list`)")
        if token.revoked_at is not None:
            return False
        token.revoked_at = utcnow()
        return True


def team_of_secret(factory: Factory, secret: str) -> TeamInfo | None:
    """The team a live token's secret names; None for an unknown or revoked one. The lookup is by the secret's
    hash: the comparison the database makes is over hashes, so its timing says nothing about the secret."""
    with factory() as s:
        team = s.scalar(select(Team).join(Token, Token.team_id == Team.id).where(
            Token.secret_sha256 == secret_hash(secret), Token.revoked_at.is_(None)))
        return None if team is None else _info(team)


def owned_run(factory: Factory, team: TeamInfo, run: str) -> Run:
    """The run named `run` (name or id) if `team` owns it; RunNotFound otherwise, with the same words either way."""
    with factory() as s:
        try:
            run_id = _run_id(s, run)
        except RunNotFound:
            run_id = None
        row = None if run_id is None else s.scalar(select(Run).where(Run.id == run_id, team.owns))
    if row is None:
        raise RunNotFound(f"no run named or numbered {run!r}")
    return row


def month_start(now: datetime) -> datetime:
    """The first moment of `now`'s calendar month, UTC: a team's monthly_usd counts from here."""
    now = now.astimezone(timezone.utc)
    return datetime(now.year, now.month, 1, tzinfo=timezone.utc)


def month_charges(s: Session, team_id: int, default: bool, since: datetime) -> int:
    """Micro-dollars charged to the team's videos since `since` (every kind of cost record, as a run's budget)."""
    return int(s.scalar(select(func.coalesce(func.sum(CostRecord.amount_micro_usd), 0))
                        .join(Video, Video.id == CostRecord.video_id).join(Run, Run.id == Video.run_id)
                        .where(owns(team_id, default), CostRecord.created_at >= since)))


@dataclass(frozen=True)
class TeamUsage:
    team: str
    running: int  # videos
    queued: int  # videos pending
    month_usd: float
    max_gpus: int | None
    monthly_usd: float | None
    share: float


def usage(factory: Factory, now: datetime | None = None) -> list[TeamUsage]:
    """Each team's running and queued videos and its month-to-date charges (`reelbatch status`, the metrics)."""
    since = month_start(now or utcnow())
    with factory.begin() as s:
        default_id = default_team_id(s)
        team = func.coalesce(Run.team_id, default_id)
        counts = s.execute(select(team, Video.status, func.count()).join(Run, Run.id == Video.run_id)
                           .where(Video.status.in_([Status.RUNNING, Status.PENDING])).group_by(team, Video.status))
        by = {(t, Status(st)): n for t, st, n in counts}
        return [TeamUsage(t.name, by.get((t.id, Status.RUNNING), 0), by.get((t.id, Status.PENDING), 0),
                          month_charges(s, t.id, t.name == DEFAULT, since) / 1e6, t.max_gpus,
                          None if t.monthly_micro_usd is None else t.monthly_micro_usd / 1e6, t.share)
                for t in s.scalars(select(Team).order_by(Team.id))]
