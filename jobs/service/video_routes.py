"""A run's videos a page at a time (their report entries, filtered by state and flag), and a video's MP4 and
poster: streamed from a local store (the file as it is, with ranges), or, from S3, a 307 to a presigned URL valid
for `presign_s` seconds (the bytes never pass through the service). A video not stored yet is 404, as one of another
team's run."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from sqlalchemy import select

from jobs.db.rows import Video
from jobs.db.teams import TeamInfo, owned_run
from jobs.manifest.keys import object_key, poster_key
from jobs.service.auth import caller
from jobs.service.ids import RunName
from jobs.usecases import reports
from storage.stores import LocalStore, S3Store, open_store

router = APIRouter(prefix="/v1/runs/{run}/videos", tags=["videos"])
Team = Annotated[TeamInfo, Depends(caller)]


State = Literal["pending", "running", "succeeded", "failed", "cancelled"]


@router.get("", summary="A page of a run's videos", description="Their entries as in the run's report, in the "
            "order submitted, with `row` (a position); `next` is the `after` of the next page (null: none). "
            "`status` (repeatable) keeps those in the states named; `flagged=true` those flagged by their checks or "
            "marked for review, `false` the others. A page costs the same in a run of any size.")
def video_list(request: Request, team: Team, run: RunName,
               status: Annotated[Optional[list[State]], Query()] = None, flagged: Optional[bool] = None,
               after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
               limit: Annotated[int, Query(ge=1, le=500)] = 100) -> dict:
    page = reports.video_page(request.app.state.settings, run, team, tuple(status or ()), flagged, after, limit)
    return {"videos": page.videos, "next": page.next}


def _object(request: Request, team: TeamInfo, run: str, video: str, poster: bool) -> Response:
    factory = request.app.state.factory
    row = owned_run(factory, team, run)
    with factory() as s:
        found = s.execute(select(Video.uri, Video.poster_uri).where(Video.run_id == row.id, Video.key == video)).first()
    if found is None or (found.poster_uri if poster else found.uri) is None:
        raise HTTPException(404, detail=f"run {row.name} has no stored {'poster' if poster else 'video'} {video!r}")
    key = poster_key(row.name, video) if poster else object_key(row.name, video)
    store = open_store(row.output)
    kind = "image/jpeg" if poster else "video/mp4"
    if isinstance(store, LocalStore):
        return FileResponse(store.path(key), media_type=kind)
    if isinstance(store, S3Store):
        return RedirectResponse(store.presigned_get(key, request.app.state.config.presign_s), 307)
    return Response(store.get(key), media_type=kind)


@router.get("/{video}.mp4", summary="A video's MP4", response_class=Response)
def mp4(request: Request, team: Team, run: RunName, video: str) -> Response:
    return _object(request, team, run, video, poster=False)


@router.get("/{video}/poster.jpg", summary="A video's poster (its middle frame)", response_class=Response)
def poster(request: Request, team: Team, run: RunName, video: str) -> Response:
    return _object(request, team, run, video, poster=True)
