"""A team's runs: list them, one's status (counts by state, deadline, budget), its report (`report --json`'s JSON),
its results.jsonl and errors.jsonl, and cancel, resume and a new budget. Every route finds the run among the
caller's team's runs first (jobs.db.teams.owned_run: another team's run is 404, as one that does not exist), then
calls the CLI's own function with the run's name."""

from __future__ import annotations

from typing import Annotated, Union

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from jobs.cli.plan import change_budget
from jobs.cli.reports import report_data
from jobs.cli.runs import cancel_and_finish, resume_and_queue, run_plans
from jobs.db import queries
from jobs.db.teams import TeamInfo, owned_run
from jobs.reports.results import result_files
from jobs.service.auth import caller

router = APIRouter(prefix="/v1/runs", tags=["runs"])
Team = Annotated[TeamInfo, Depends(caller)]


def _status(request: Request, team: TeamInfo, run: str | None) -> list[dict]:
    """`status --json`'s entries for the team's runs (or its run `run`)."""
    factory, settings = request.app.state.factory, request.app.state.settings
    name = None if run is None else owned_run(factory, team, run).name
    rows = queries.run_counts(factory, name, owner=(team.owns,))
    plans = run_plans(factory, settings, [r.run_id for r in rows])
    return [{"run_id": r.run_id, "name": r.name, "model": r.model, "created_at": r.created_at.isoformat(),
             "total": r.total, "counts": r.counts, **plans[r.run_id]} for r in rows]


@router.get("", summary="List the team's runs", description="As `reelbatch status --json`, the team's runs only.")
def list_runs(request: Request, team: Team) -> dict:
    return {"runs": _status(request, team, None)}


@router.get("/{run}", summary="One run's status", description="Counts by state, deadline and budget, as an entry "
            "of `reelbatch status RUN --json`. RUN: the run's name or id.")
def run_status(request: Request, team: Team, run: str) -> dict:
    (found,) = _status(request, team, run)
    return found


@router.get("/{run}/report", summary="One run's report", description="The same JSON as `reelbatch report RUN --json`.")
def report(request: Request, team: Team, run: str) -> dict:
    row = owned_run(request.app.state.factory, team, run)
    return report_data(request.app.state.settings, request.app.state.factory, row.name)


def _result_file(request: Request, team: TeamInfo, run: str, which: int) -> Response:
    factory = request.app.state.factory
    row, videos = queries.load_report(factory, owned_run(factory, team, run).name)
    return Response(result_files(row, videos)[which], media_type="application/jsonl")


@router.get("/{run}/results.jsonl", summary="One run's results file", response_class=Response,
            description="One JSON line a video, as `report --results` writes beside its videos.")
def results(request: Request, team: Team, run: str) -> Response:
    return _result_file(request, team, run, 0)


@router.get("/{run}/errors.jsonl", summary="One run's errors file", response_class=Response,
            description="One JSON line a failed or cancelled video: id, code, message.")
def errors(request: Request, team: Team, run: str) -> Response:
    return _result_file(request, team, run, 1)


@router.post("/{run}/cancel", summary="Cancel a run", description="As `reelbatch cancel`: pending videos now, "
             "running batches at their next step. Idempotent.")
async def cancel(request: Request, team: Team, run: str) -> dict:
    row = owned_run(request.app.state.factory, team, run)
    name, count = await run_in_threadpool(cancel_and_finish, request.app.state.settings, row.name)
    return {"name": name, "cancelled": count}


@router.post("/{run}/resume", summary="Resume a run", description="As `reelbatch resume`: failed and cancelled "
             "videos back in the queue. Idempotent.")
async def resume(request: Request, team: Team, run: str) -> dict:
    row = owned_run(request.app.state.factory, team, run)
    name, count = await run_in_threadpool(resume_and_queue, request.app.state.settings, row.name)
    return {"name": name, "requeued": count}


@router.put("/{run}/budget", summary="Change a run's budget", description="As `reelbatch budget RUN USD`: "
            '`{"max_cost_usd": 2.5}`, or `null` for no cap.')
async def budget(request: Request, team: Team, run: str,
                 max_cost_usd: Annotated[Union[float, str, None], Body(embed=True)]) -> dict:
    row = owned_run(request.app.state.factory, team, run)
    usd = "none" if max_cost_usd is None else str(max_cost_usd)
    change, cap = await run_in_threadpool(change_budget, request.app.state.settings, row.name, usd)
    return {"name": change.name, "max_cost_usd": cap, "charged_usd": change.charged_usd, "requeued": change.requeued}
