"""The OpenAPI description as the contract (/openapi.json): what FastAPI derives from the routes, completed here
with what it cannot see. The manifest's request bodies (YAML, JSONL, multipart) and their media types, the bearer
scheme (jobs.service.auth), and every status each route can answer with its body's schema: the server's own error
bodies are one shape (Problem; a manifest's or a request's problems add `issues`), which app.py's handlers send.
tests/jobs/test_service_contract.py runs a property-based tester (schemathesis) against the real server with it."""

from __future__ import annotations

from typing import Literal, Optional, Union

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, StrictFloat, StrictInt

from jobs.errors import UsageError
from jobs.manifest.fields import check_max_cost
from jobs.manifest.values import FieldError


class Issue(BaseModel):
    file: str
    line: int
    field: str
    message: str
    text: str  # FILE:LINE: FIELD: MESSAGE, as the CLI prints it


class Problem(BaseModel):
    """Every error body the server sends."""

    detail: str
    issues: Optional[list[Issue]] = None  # a manifest's problems (422), or a request's parameters (422)


class Submitted(BaseModel):
    run_id: int
    name: str
    videos: int
    created: bool
    pending: int
    # False: the run is recorded but the broker could not be reached; a worker's sweep queues it once it answers.
    queued: bool


# A budget is a number of US dollars, or `none` / null for no cap: never a boolean or a string of digits
# (`true` was once a $1 cap and "0x10" a $16 one).
Usd = Union[StrictInt, StrictFloat, Literal["none"], None]


def usd_cap(value: Usd) -> float | None:
    """A budget's cap (None: no cap), by the manifest's rule for max_cost_usd."""
    if value is None or value == "none":
        return None
    try:
        return check_max_cost(value, None)
    except FieldError as exc:
        raise UsageError(f"max_cost_usd: {exc}") from None


_MANIFEST = {"required": True, "description": "The manifest: a YAML run or a JSONL file (one video a line).",
             "content": {kind: {"schema": {"type": "string"}} for kind in ("application/yaml", "application/jsonl")}
             | {"multipart/form-data": {"schema": {"type": "object", "required": ["manifest"], "properties": {
                 "manifest": {"type": "string", "format": "binary", "description": "The manifest file; its "
                              "name (NAME.yaml, NAME.jsonl) says which it is."}}}}}}
_WHY = {400: "Refused by the server whatever the manifest says: an output outside the team's output root, a run "
             "name the API does not take; or a body that is not JSON where JSON is asked for",
        401: "No token, or an unknown or revoked one (sent before the body is read)",
        404: "No such run, or another team's (the same words either way)",
        409: "The run name is taken", 413: "The body is over the limit (`serve --max-body-bytes`)",
        415: "The body is not YAML, JSONL or multipart/form-data",
        422: "A manifest's problems (FILE:LINE in `issues`) or a bad parameter", 429: "Over a rate limit; see "
        "Retry-After", 502: "The store cannot be read", 503: "The database or broker cannot be reached"}
_RUN = (401, 404, 422, 503)
# Each operation's error statuses (the success ones are FastAPI's, from the routes).
STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/runs"): (400, 401, 409, 413, 415, 422, 429, 503),
    ("post", "/v1/estimate"): (400, 401, 413, 415, 422, 429, 503),
    ("get", "/v1/runs"): (401, 422, 503),
    ("get", "/v1/runs/{run}"): _RUN, ("get", "/v1/runs/{run}/report"): _RUN,
    ("get", "/v1/runs/{run}/results.jsonl"): (*_RUN, 502), ("get", "/v1/runs/{run}/errors.jsonl"): (*_RUN, 502),
    ("post", "/v1/runs/{run}/cancel"): (*_RUN, 429), ("post", "/v1/runs/{run}/resume"): (*_RUN, 429),
    ("put", "/v1/runs/{run}/budget"): (*_RUN, 400, 413, 429),
    ("get", "/v1/runs/{run}/videos"): _RUN,
    ("get", "/v1/runs/{run}/videos/{video}.mp4"): (*_RUN, 502),
    ("get", "/v1/runs/{run}/videos/{video}/poster.jpg"): (*_RUN, 502),
}
_FILES = {"/v1/runs/{run}/results.jsonl": "application/jsonl", "/v1/runs/{run}/errors.jsonl": "application/jsonl",
          "/v1/runs/{run}/videos/{video}.mp4": "video/mp4", "/v1/runs/{run}/videos/{video}/poster.jpg": "image/jpeg"}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def describe(app: FastAPI) -> dict:
    """The app's OpenAPI description, completed (computed once, as FastAPI's own)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in (Issue, Problem, Submitted):
        schemas[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    for (method, path), statuses in STATUSES.items():
        operation = doc["paths"].get(path, {}).get(method)
        if operation is None:
            continue
        responses = operation["responses"]
        for status in statuses:
            responses[str(status)] = {"description": _WHY[status],
                                      "content": {"application/json": {"schema": _ref("Problem")}}}
        if 401 in statuses:
            responses["401"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        if 429 in statuses:
            responses["429"]["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
        if path in ("/v1/runs", "/v1/estimate") and method == "post":
            operation["requestBody"] = _MANIFEST
        if path in _FILES:
            responses["200"] = {"description": "The file", "content": {_FILES[path]: {"schema": {
                "type": "string", "format": "binary"}}}}
            if "/videos/" in path:
                responses["307"] = {"description": "Stored in S3: a presigned URL to fetch it from",
                                    "headers": {"Location": {"schema": {"type": "string"}}}}
    submit = doc["paths"].get("/v1/runs", {}).get("post", {}).setdefault("responses", {})
    submit["200"] = {"description": "The same manifest again: the run it made",
                     "content": {"application/json": {"schema": _ref("Submitted")}}}
    submit["201"] = {"description": "A new run", "content": {"application/json": {"schema": _ref("Submitted")}}}
    app.openapi_schema = doc
    return doc
