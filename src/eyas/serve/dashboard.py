"""``GET /dashboard``: one static page (``dashboard.html``) showing acceptance at a glance.

The page is plain HTML with a little JavaScript, no build step and nothing fetched from elsewhere
(servers often have no internet). It polls this server's ``/metrics`` every two seconds, parses the
Prometheus text itself and shows tau, the acceptance rate, per-position acceptance, tokens/s,
running and queued requests and KV-cache usage. It carries no data and no key: it answers without
the API key (``middleware.open_paths``), and when ``/metrics`` needs the key (``--metrics-require-key``)
the page asks the user for it and keeps it in the tab's memory only.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()

# The page runs its one inline script and talks to this origin only.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@cache
def page() -> str:
    return files("eyas.serve").joinpath("dashboard.html").read_text(encoding="utf-8")


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(page(), headers=HEADERS)
