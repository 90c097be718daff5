"""The desk's page (``GET /review/``) and its script and style (``/review/static/<file>``), served
under a Content-Security-Policy; what a visitor who is not signed in reads instead."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse

PAGE_DIR = Path(__file__).parent.parent / "page"
STATIC_FILES = {"page.js": "text/javascript", "page.css": "text/css"}

# The page under a Content-Security-Policy: its own scripts and styles, same-origin requests only,
# nothing from elsewhere (an image link in a model's output could not load even if rendered).
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
)
SVG_CSP = "default-src 'none'; style-src 'unsafe-inline'"

LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Review desk: sign in</title></head>
<body><h1>Review desk</h1><p>Not signed in. Sign in to Airflow, then open the run's
<b>Review desk</b> tab (or Browse → Review desk).</p></body></html>
"""

router = APIRouter(include_in_schema=False)


@router.get("/review/")
def page() -> FileResponse:
    return FileResponse(
        PAGE_DIR / "index.html", media_type="text/html", headers={"Content-Security-Policy": PAGE_CSP}
    )


@router.get("/review/static/{name}")
def static(name: str) -> FileResponse:
    if name not in STATIC_FILES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such file")
    return FileResponse(PAGE_DIR / name, media_type=STATIC_FILES[name])
