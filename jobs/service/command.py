"""`reelbatch serve`: the HTTP API teams share (jobs.service) on uvicorn, with the live page at / and the OpenAPI
description at /openapi.json. Put it behind a reverse proxy that ends TLS (docs/SERVICE.md): tokens travel in a
header, so the link from the client to the proxy must be encrypted.

It refuses to start (exit 2, one line naming the setting) while any team could write outside the allowed outputs:
REELBATCH_ALLOWED_OUTPUTS unset (anywhere), or a team's output root outside it (jobs.usecases.teams)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from jobs.errors import ReelbatchError
from jobs.settings import Settings


def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on (a proxy in front: keep 127.0.0.1).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8000,
    max_body_bytes: Annotated[int, typer.Option(
        "--max-body-bytes", min=1, help="Largest request body (a manifest); larger: 413.")] = 16 << 20,
    submits_per_minute: Annotated[int, typer.Option(
        "--submits-per-minute", min=1, help="Submissions a team may make in any minute; more: 429.")] = 30,
    estimates_per_minute: Annotated[int, typer.Option(
        "--estimates-per-minute", min=1, help="Estimates a team may ask for in any minute; more: 429.")] = 30,
    changes_per_minute: Annotated[int, typer.Option(
        "--changes-per-minute", min=1, help="Cancels, resumes and budget changes a team may make in any minute; "
                                            "more: 429.")] = 60,
    forwarded_allow_ips: Annotated[str, typer.Option(
        "--forwarded-allow-ips", help="Proxies whose X-Forwarded-* headers are believed.")] = "127.0.0.1",
) -> None:
    """Serve the HTTP API and the live page: every request acts for the team its bearer token names."""
    import uvicorn  # here, not at the top: only this command needs the server

    from jobs.service import ServiceConfig, create_app, uploads
    from jobs.service.logs import log_config
    from jobs.usecases.teams import unsafe_outputs

    try:
        settings = Settings.from_env()
        unsafe = unsafe_outputs(settings)
        if unsafe is not None:
            print(f"reelbatch serve: refusing to start: {unsafe}", file=sys.stderr)
            raise typer.Exit(2)
        # Under the cache folder, one a port: two servers on one machine never empty each other's uploads.
        upload_dir = settings.engine.cache_dir / "uploads" / str(port)
        uploads.clear(upload_dir)
        app = create_app(settings, ServiceConfig(max_body_bytes=max_body_bytes, submits_per_minute=submits_per_minute,
                                                 estimates_per_minute=estimates_per_minute,
                                                 changes_per_minute=changes_per_minute, upload_dir=upload_dir))
    except ReelbatchError as exc:
        print(exc, file=sys.stderr)  # a user error: its message, no traceback
        raise typer.Exit(exc.exit_code) from None
    print(f"reelbatch serving on http://{host}:{port}/ (API description: /openapi.json)", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=host, port=port, proxy_headers=True, forwarded_allow_ips=forwarded_allow_ips,
                log_level="info", server_header=False, log_config=log_config())
