"""The service assembled: FastAPI (for the OpenAPI description it derives from the routes, completed by
jobs.service.contract and served at /openapi.json) on uvicorn (an ASGI server made for production: HTTP/1.1
keep-alive, graceful shutdown, proxy headers; jobs.service.command). A request meets, in order: its token, from the
headers alone (jobs.service.auth), then the body limit (jobs.service.guards), then its route. The CLI's errors become
HTTP statuses here, in one place, every body a contract.Problem:

- a request the server refuses whatever the manifest says (Refused: an output outside the team's root): 400;
- a manifest's problems (ManifestError): 422, every FILE:LINE message, as the CLI prints them; a bad parameter: 422;
- a run that is not the team's (or does not exist): 404, the same words either way (jobs.db.teams.owned_run);
- a run name taken: 409; any other bad input (UsageError): 422; a store that cannot be reached: 502;
- any other reelbatch error: 503 (the database or broker is down, the schema is behind).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from jobs.db.connect import session_factory, snapshots
from jobs.errors import ReelbatchError, RunNameTaken, RunNotFound, UsageError
from jobs.manifest.specs import ManifestError
from jobs.service.auth import Authenticate
from jobs.service.contract import describe
from jobs.service.guards import BodyLimit, Rates
from jobs.settings import Settings
from jobs.usecases.submit import Refused
from jobs.work.deadlines import QueueSnapshot
from storage.stores import StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceConfig:
    # A manifest's body: reelbatch reads manifests of up to 64 MiB (jobs.manifest.read); 16 MiB holds ~50,000
    # videos of a typical JSONL line and keeps one request's memory bounded.
    max_body_bytes: int = 16 << 20
    # Per team, in any minute (jobs.service.guards.Rates); past them: 429 with Retry-After.
    submits_per_minute: int = 30
    estimates_per_minute: int = 30
    changes_per_minute: int = 60
    # How long a presigned S3 URL (a video or poster) stays valid: long enough to start a download.
    presign_s: int = 300
    # Where uploaded manifests are written while they are read (jobs.service.uploads); `serve` empties it at start.
    # None: the system's temporary folder.
    upload_dir: Path | None = None


def create_app(settings: Settings, config: ServiceConfig = ServiceConfig()) -> FastAPI:
    from jobs.service import page, run_routes, submit_routes, video_routes  # the routes import this module's names

    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN, and nothing here comes from the internet.
    app = FastAPI(title="reelbatch", version="1", docs_url=None, redoc_url=None,
                  description="Render manifests of text-to-video prompts to MP4s, as a team. Every route takes "
                              "`Authorization: Bearer TOKEN` (`reelbatch token create --team NAME`).")
    app.state.settings, app.state.config = settings, config
    # The routes' own reads (a token's team, a run's id, a video's row, the queue): snapshots, which on SQLite never
    # wait for a writer's lock (another team's large submit). What changes rows goes through the use cases.
    app.state.factory = snapshots(session_factory(settings.database_url))
    # The work ahead of a team's runs, read every few seconds: one team's queue never slows another's status.
    app.state.queue = QueueSnapshot(app.state.factory)
    app.state.rate = Rates({"submissions": config.submits_per_minute, "estimates": config.estimates_per_minute,
                            "changes": config.changes_per_minute})
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(Authenticate)  # added last, so it runs first: no body is read for a request without a token
    for module in (submit_routes, run_routes, video_routes):
        app.include_router(module.router, dependencies=[Depends(known_query)])
    app.include_router(page.router)
    app.add_exception_handler(ReelbatchError, _reelbatch_error)
    app.add_exception_handler(StoreError, _store_error)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.openapi = lambda: describe(app)
    return app


def known_query(request: Request) -> None:
    """A query parameter the route does not take is a 422 naming it, as a manifest's unknown field is: a typo
    (`?entires=0`) must not be answered as if it were not there."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is None:
        return
    known = sorted(_query_names(dependant))
    unknown = sorted(set(request.query_params) - set(known))
    if unknown:
        takes = ", ".join(known) if known else "none"
        raise RequestValidationError([{"loc": ("query", name), "type": "extra_forbidden",
                                       "msg": f"unknown query parameter (this route takes: {takes})"}
                                      for name in unknown])


def _query_names(dependant) -> set[str]:
    """The query parameters a route takes, its dependencies' included (FastAPI's Dependant tree)."""
    return {p.alias for p in dependant.query_params}.union(*(_query_names(d) for d in dependant.dependencies))


def _reelbatch_error(_request: Request, exc: ReelbatchError) -> JSONResponse:
    if isinstance(exc, ManifestError):
        return JSONResponse({"detail": str(exc), "issues": [
            {"file": i.file, "line": i.line, "field": i.field, "message": i.message, "text": str(i)}
            for i in exc.issues]}, 422)
    status = (400 if isinstance(exc, Refused) else 404 if isinstance(exc, RunNotFound)
              else 409 if isinstance(exc, RunNameTaken) else 422 if isinstance(exc, UsageError) else 503)
    if status == 503:
        log.warning("%s", exc)
    return JSONResponse({"detail": str(exc)}, status)


def _bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """A parameter or JSON body FastAPI could not read, in the server's one error shape (contract.Problem)."""
    issues = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error.get("loc", ()))
        message = str(error.get("msg", "invalid"))
        issues.append({"file": "(request)", "line": 0, "field": field, "message": message,
                       "text": f"{field}: {message}"})
    return JSONResponse({"detail": "; ".join(i["text"] for i in issues) or "invalid request", "issues": issues}, 422)


def _store_error(_request: Request, exc: StoreError) -> JSONResponse:
    log.warning("%s", exc)
    return JSONResponse({"detail": f"the store cannot be read: {exc}"}, 502)
