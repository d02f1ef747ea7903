"""POST /v1/runs (submit a manifest) and POST /v1/estimate (estimate one, recording nothing), with the CLI's run
options as query parameters (name, model, output, notify, set (repeatable), new_run; gpus for the estimate).

The manifest is the body: YAML (Content-Type application/yaml) or JSONL (application/jsonl), or a multipart upload
whose `manifest` part names its file. It is written to a private folder under the service's upload folder
(jobs.service.uploads) under the name it was sent with (`filename=`, else manifest.yaml / manifest.jsonl) and read
by the use cases the CLI calls too (jobs.usecases), so every rule and every FILE:LINE message is the CLI's; the
folder is removed afterwards. What the team may ask is narrowed first (jobs.service.policy): its run's output lies
under the team's output root, and its run's name is never all digits. Relative image paths therefore resolve to nothing
on the server: name images by URI under REELBATCH_ALLOWED_INPUTS."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from jobs.db.teams import TeamInfo
from jobs.manifest.specs import ManifestError, ManifestIssue
from jobs.service import uploads
from jobs.service.auth import caller
from jobs.service.policy import checked
from jobs.usecases.estimate import estimate_manifest
from jobs.usecases.submit import Options, send_more_tickets, submit_manifest
from jobs.work.tickets import FIRST_TICKETS

router = APIRouter(prefix="/v1", tags=["submit"])

_TYPES = {"application/yaml": ".yaml", "application/x-yaml": ".yaml", "text/yaml": ".yaml", "text/x-yaml": ".yaml",
          "application/jsonl": ".jsonl", "application/x-ndjson": ".jsonl", "application/jsonlines": ".jsonl",
          "text/jsonl": ".jsonl"}
_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
Team = Annotated[TeamInfo, Depends(caller)]
_DOC = ("The manifest as the body (application/yaml or application/jsonl) or as the `manifest` part of a "
        "multipart/form-data upload.")


async def _manifest(request: Request, filename: str | None) -> tuple[str, bytes]:
    """(the file name the manifest is read under, its bytes)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        form = await request.form()
        part = form.get("manifest")
        if part is None or isinstance(part, str):
            raise HTTPException(422, detail="multipart upload: send the manifest as a file part named `manifest`")
        data, filename = await part.read(), filename or part.filename or ""
    elif kind in _TYPES:
        data, filename = await request.body(), filename or f"manifest{_TYPES[kind]}"
    else:
        raise HTTPException(415, detail=f"Content-Type {kind or '(none)'!r}: send application/yaml, "
                                        "application/jsonl or multipart/form-data")
    filename = Path(filename).name
    if not _FILENAME.match(filename):
        raise HTTPException(422, detail=f"file name {filename!r}: use letters, digits, '.', '-' and '_'")
    return filename, data


def _as_sent(exc: ManifestError, folder: str, filename: str) -> ManifestError:
    """The manifest's problems named by the file as it was sent, not by the temporary folder it was read from."""
    return ManifestError([ManifestIssue(filename if i.file.startswith(folder) else i.file, i.line, i.field, i.message)
                          for i in exc.issues])


def _read(work, filename: str, data: bytes, root: Path | None):
    with uploads.folder(root) as folder:
        path = Path(folder) / filename
        path.write_bytes(data)
        try:
            return work(path)
        except ManifestError as exc:
            raise _as_sent(exc, folder, filename) from None


@router.post("/runs", summary="Submit a manifest", description=_DOC + " Idempotent as `reelbatch submit`: the "
             "same manifest again answers 200 with the same run; a new run answers 201.")
async def submit(request: Request, team: Team, name: Optional[str] = None, model: Optional[str] = None,
                 output: Optional[str] = None, notify: Optional[str] = None,
                 set_: Annotated[Optional[list[str]], Query(alias="set")] = None, new_run: bool = False,
                 filename: Optional[str] = None) -> JSONResponse:
    settings = checked(request.app.state.settings, team, output, name)
    filename, data = await _manifest(request, filename)
    # A submission is a manifest sent, whether it then passes its checks or not.
    request.app.state.rate.check(team, "submissions")

    def work(path: Path):
        return submit_manifest(settings, path, Options(name, model, output, tuple(set_ or ()), notify, served=True),
                               new_run=new_run, team_id=team.id, source=f"http: team {team.name}, {filename}",
                               tickets=FIRST_TICKETS)

    s = await run_in_threadpool(_read, work, filename, data, request.app.state.config.upload_dir)
    # The answer goes once the run is recorded and its first tickets are queued; the rest follow (Starlette runs a
    # response's background task after sending it, and a graceful shutdown waits for it).
    return JSONResponse({"run_id": s.run_id, "name": s.name, "videos": s.videos, "created": s.created,
                         "pending": s.pending_units, "queued": s.unqueued is None}, 201 if s.created else 200,
                        background=BackgroundTask(send_more_tickets, settings, s.name, s.model, s.pending_units,
                                                  FIRST_TICKETS) if s.created and s.unqueued is None else None)


@router.post("/estimate", summary="Estimate a manifest", description=_DOC + " Checks it as a submission would and "
             "records nothing: the same JSON as `reelbatch estimate --json`.")
async def estimate(request: Request, team: Team, name: Optional[str] = None, model: Optional[str] = None,
                   output: Optional[str] = None, set_: Annotated[Optional[list[str]], Query(alias="set")] = None,
                   gpus: Annotated[Optional[int], Query(ge=1, le=100000)] = None,
                   filename: Optional[str] = None) -> dict:
    settings = checked(request.app.state.settings, team, output, name)
    filename, data = await _manifest(request, filename)
    request.app.state.rate.check(team, "estimates")
    options = Options(name, model, output, tuple(set_ or ()), served=True)
    return await run_in_threadpool(_read, lambda path: estimate_manifest(settings, path, options, gpus,
                                                                          queue=request.app.state.queue),
                                   filename, data, request.app.state.config.upload_dir)
