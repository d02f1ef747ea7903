"""`reelbatch team add|update|list` and `reelbatch token create|list|revoke`: the teams that share a fleet through the
HTTP API (`reelbatch serve`), their shares, quotas and output roots, and their tokens. A token's secret is printed once,
by `token create`, and stored only as its SHA-256 (jobs.db.teams)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer
from rich.table import Table

from jobs.cli.console import emit_json, fail, out
from jobs.errors import ReelbatchError
from jobs.settings import Settings
from jobs.usecases import teams

team_app = typer.Typer(help="Teams that share the fleet: their shares and quotas.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens: each names one team.", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def _settings() -> Settings:
    return Settings.from_env()


OutputOpt = Annotated[Optional[str], typer.Option(
    "--output", help="Where its runs over the API may write: file:///DIR/ or s3://BUCKET/PREFIX/, under "
                     "REELBATCH_ALLOWED_OUTPUTS; `default`: the service's output with the team's name as a prefix.")]


@team_app.command("add")
def team_add(
    name: Annotated[str, typer.Argument(help="Team name: lower-case letters, digits, '-' and '_'.")],
    share: Annotated[float, typer.Option("--share", help="Weight of its share of idle capacity.")] = 1.0,
    max_gpus: Annotated[Optional[int], typer.Option(
        "--max-gpus", help="Most batches of its work running at once, one per GPU (default: no limit).")] = None,
    monthly_usd: Annotated[Optional[float], typer.Option(
        "--monthly-usd", help="Its charges in a calendar month (UTC) past which no new work starts.")] = None,
    output: OutputOpt = None,
) -> None:
    """Add a team, or set an existing team's share and quotas (the same command again changes nothing)."""
    try:
        team = teams.add_team(_settings(), name, share, max_gpus, monthly_usd, output)
    except ReelbatchError as exc:
        fail(exc)
    _print(team)


@team_app.command("update")
def team_update(
    name: Annotated[str, typer.Argument(help="The team's name.")],
    share: Annotated[Optional[float], typer.Option("--share", help="Weight of its share of idle capacity.")] = None,
    max_gpus: Annotated[Optional[int], typer.Option("--max-gpus", help="Most batches running at once.")] = None,
    monthly_usd: Annotated[Optional[float], typer.Option("--monthly-usd", help="Its monthly charges cap.")] = None,
    output: OutputOpt = None,
) -> None:
    """Change what is given of an existing team; the rest stays as it is."""
    try:
        team = teams.update_team(_settings(), name, share, max_gpus, monthly_usd, output)
    except ReelbatchError as exc:
        fail(exc)
    _print(team)


def _print(team) -> None:
    out.print(f"team {team.id} {team.name}: share {team.share:g}, max GPUs {_limit(team.max_gpus)}, monthly "
              f"{_limit(team.monthly_usd, '$')}, output {team.output or 'default'}", highlight=False)


@team_app.command("list")
def team_list(json_: JsonOpt = False) -> None:
    """Every team with its share and quotas."""
    try:
        rows = teams.list_teams(_settings())
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        emit_json({"teams": [dataclasses.asdict(t) for t in rows]})
        return
    table = Table("team", "name", "share", "max GPUs", "monthly", "output", box=None, pad_edge=False)
    for t in rows:
        table.add_row(str(t.id), t.name, f"{t.share:g}", _limit(t.max_gpus), _limit(t.monthly_usd, "$"),
                      t.output or "default")
    out.print(table)


def _limit(value, unit: str = "") -> str:
    return "no limit" if value is None else f"{unit}{value:g}"


@token_app.command("create")
def token_create(team: Annotated[str, typer.Option("--team", help="The team the token acts for.")]) -> None:
    """Make a token for a team and print its secret, once: it is stored only as a hash and cannot be shown again."""
    try:
        token = teams.create_token(_settings(), team)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"token {token.id} for team {team}; its secret (shown only now):", highlight=False)
    out.print(token.secret, highlight=False)


@token_app.command("list")
def token_list(json_: JsonOpt = False) -> None:
    """Every token's id, team, creation and revocation (never a secret)."""
    try:
        data = [t.as_dict() for t in teams.list_tokens(_settings())]
    except ReelbatchError as exc:
        fail(exc)
    if json_:
        emit_json({"tokens": data})
        return
    table = Table("token", "team", "created", "revoked", box=None, pad_edge=False)
    for t in data:
        table.add_row(str(t["id"]), t["team"], t["created_at"][:19], (t["revoked_at"] or "")[:19])
    out.print(table)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[int, typer.Argument(help="The token's id (see `reelbatch token list`).")]) -> None:
    """Revoke a token: requests bearing it are refused (401) from now on. Idempotent."""
    try:
        live = teams.revoke_token(_settings(), token_id)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"token {token_id} revoked" if live else f"token {token_id} was already revoked")
