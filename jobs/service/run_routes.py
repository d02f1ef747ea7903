"""A team's runs: list them, one's status (counts by state, deadline, budget), its report (`report --json`'s JSON),
its results.jsonl and errors.jsonl, and cancel, resume and a new budget. Every route finds the run among the
caller's team's runs only (the use cases, jobs.usecases, given the team: another team's run is 404, as one that
does not exist), through the same use cases the CLI calls."""

from __future__ import annotations

from typing import Annotated, Optional

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from jobs.db.teams import TeamInfo
from jobs.service.auth import caller
from jobs.service.contract import Usd, usd_cap
from jobs.service.ids import RunName
from jobs.usecases import reports, runs
from jobs.usecases.submit import send_more_tickets
from jobs.work.tickets import FIRST_TICKETS

router = APIRouter(prefix="/v1/runs", tags=["runs"])
Team = Annotated[TeamInfo, Depends(caller)]


@router.get("", summary="List the team's runs", description="As `reelbatch status --json`, the team's runs only, "
            "a page at a time: the newest `limit` (default 100) with an id under `before`, oldest first; "
            "`next_before`: the `before` of the page of older runs, null when there are none.")
def list_runs(request: Request, team: Team, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
              before: Annotated[Optional[int], Query(ge=1, le=2**63 - 1)] = None) -> dict:
    found = runs.status(request.app.state.settings, team=team, queue=request.app.state.queue, limit=limit,
                        before=before)
    return {"runs": found.runs, "next_before": found.next_before}


@router.get("/{run}", summary="One run's status", description="Counts by state, deadline and budget, as an entry "
            "of `reelbatch status RUN --json`. RUN: the run's name or id.")
def run_status(request: Request, team: Team, run: RunName) -> dict:
    (found,) = runs.status(request.app.state.settings, run, team=team, queue=request.app.state.queue).runs
    return found


@router.get("/{run}/report", summary="One run's report", description="The same JSON as `reelbatch report RUN --json`, "
            "its `videos` the first `entries` of them (default 1,000; `videos_omitted`: how many more): page through "
            "the rest with `GET /v1/runs/{run}/videos`.")
def report(request: Request, team: Team, run: RunName,
           entries: Annotated[int, Query(ge=0, le=10000)] = 1000) -> dict:
    data = reports.report(request.app.state.settings, run, team=team, listed=entries)
    data["videos_omitted"] = sum(data["counts"].values()) - min(entries, len(data["videos"]))
    data["videos"] = data["videos"][:entries]
    return data


def _result_file(request: Request, team: TeamInfo, run: str, which: str) -> Response:
    return Response(reports.result_file(request.app.state.settings, run, which, team=team),
                    media_type="application/jsonl")


@router.get("/{run}/results.jsonl", summary="One run's results file", response_class=Response,
            description="One JSON line a video, as `report --results` writes beside its videos.")
def results(request: Request, team: Team, run: RunName) -> Response:
    return _result_file(request, team, run, "results")


@router.get("/{run}/errors.jsonl", summary="One run's errors file", response_class=Response,
            description="One JSON line a failed or cancelled video: id, code, message.")
def errors(request: Request, team: Team, run: RunName) -> Response:
    return _result_file(request, team, run, "errors")


@router.post("/{run}/cancel", summary="Cancel a run", description="As `reelbatch cancel`: pending videos now, "
             "running batches at their next step. Idempotent.")
async def cancel(request: Request, team: Team, run: RunName) -> dict:
    request.app.state.rate.check(team, "changes")
    changed = await run_in_threadpool(runs.cancel, request.app.state.settings, run, team)
    return {"name": changed.name, "cancelled": changed.videos}


@router.post("/{run}/resume", summary="Resume a run", description="As `reelbatch resume`: failed and cancelled "
             "videos back in the queue. Idempotent.")
async def resume(request: Request, team: Team, run: RunName) -> dict:
    request.app.state.rate.check(team, "changes")
    settings = request.app.state.settings
    changed = await run_in_threadpool(runs.resume, settings, run, team, FIRST_TICKETS)
    # The first tickets went before the answer, the rest after it (as a submit's: jobs.work.tickets.FIRST_TICKETS).
    more = None if changed.model is None else BackgroundTask(send_more_tickets, settings, changed.name,
                                                              changed.model, changed.videos, FIRST_TICKETS)
    return JSONResponse({"name": changed.name, "requeued": changed.videos}, background=more)


@router.put("/{run}/budget", summary="Change a run's budget", description="As `reelbatch budget RUN USD`: "
            '`{"max_cost_usd": 2.5}`, or `null` for no cap.')
async def budget(request: Request, team: Team, run: RunName,
                 max_cost_usd: Annotated[Usd, Body(embed=True)]) -> dict:
    cap = usd_cap(max_cost_usd)
    request.app.state.rate.check(team, "changes")
    change = await run_in_threadpool(runs.change_budget, request.app.state.settings, run, cap, team)
    return {"name": change.name, "max_cost_usd": change.max_cost_usd, "charged_usd": change.charged_usd,
            "requeued": change.requeued}
