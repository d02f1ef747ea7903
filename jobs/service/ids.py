"""What a run's path segment names over the API: a segment of ASCII digits is a run id only (a run over the API
cannot be named so: jobs.usecases.submit.check_served_name; one the CLI named so is reached by its id), anything
else a name. An id outside the database's range (a 64-bit signed integer, as PostgreSQL's BIGINT and SQLite's
INTEGER hold) is a run that does not exist: 404 with the same words as any other, never an overflow."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import select

from jobs.db.rows import Run
from jobs.db.teams import TeamInfo
from jobs.errors import RunNotFound
from jobs.service.auth import caller

# Ids are at most 2^63 - 1, the largest value of a signed 64-bit column.
MAX_ID = (1 << 63) - 1


def as_id(segment: str) -> int | None:
    """The run id a path segment is (None: it is a name); 0 when it is digits outside every id's range."""
    if not (segment.isascii() and segment.isdigit()):
        return None
    if len(segment) > 19 or int(segment) > MAX_ID:
        return 0
    return int(segment)


def run_name(request: Request, run: str, team: Annotated[TeamInfo, Depends(caller)]) -> str:
    """The name the run routes look `run` up by (a FastAPI dependency standing for the path's {run}): a digit
    segment is resolved as an id among the team's runs; another team's, or no such id, is 404."""
    run_id = as_id(run)
    if run_id is None:
        return run
    found = None
    if run_id > 0:
        with request.app.state.factory() as s:
            found = s.scalar(select(Run.name).where(Run.id == run_id, team.owns))
    if found is None:
        raise RunNotFound(f"no run named or numbered {run!r}")
    return found


RunName = Annotated[str, Depends(run_name)]
