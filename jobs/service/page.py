"""The live page, GET /: plain HTML and a little JavaScript served by this process (nothing from the internet). It
asks for a token, keeps it in the tab's sessionStorage, and polls the API with it (jobs.service.page_html)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from jobs.service.page_html import PAGE

router = APIRouter(tags=["page"])


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers={"Cache-Control": "no-store", "Content-Security-Policy":
                                       "default-src 'self'; img-src 'self' blob:; style-src 'unsafe-inline'; "
                                       "script-src 'unsafe-inline'"})
