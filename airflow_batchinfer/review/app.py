"""The review desk's web app: the routes of :mod:`airflow_batchinfer.review.routes` on the host's
login and permissions (:class:`~airflow_batchinfer.review.routes.host.DeskHost`). The plugin builds it
with Airflow's (:mod:`airflow_batchinfer.plugin.desk`) and mounts it at ``/batchinfer`` in Airflow's
api-server.

It reads a closed round's rejected rows (:mod:`airflow_batchinfer.review.browse`) and records what a
reviewer decides about them (:mod:`airflow_batchinfer.review.decisions`) while the round's review
gate — the ``round_NN.plan`` / ``tail.plan`` task of a DAG run, waiting on the Required Actions page
— is open. Continue / Stop is still answered on the Required Actions page.

Where things come from:

- **Who**: Airflow's own login (``get_user`` on the whole app: the UI's ``_token`` cookie or a
  Bearer token); no second login.
- **May read**: GET on the DAG's HITL details (the same permission the Required Actions page needs).
  **May decide**: PUT on them and, when the gate names ``assigned_users``, being one of them — the
  checks Airflow makes before it accepts an answer to the gate.
- **Which storage**: the plan task's *rendered* ``run_root`` and ``aws_conn_id``, stored by Airflow
  when the task ran (``rendered_task_instance_fields``), and checked against the run root's
  ``owner.json``. A request names a DAG run, never a path.
- **Which round**: the gate of slot ``round_NN`` reviews round NN-1; the ``tail`` gate reviews the
  last round the plans in storage ran.

Endpoints (JSON unless noted; errors are ``{"detail": ...}``)::

    GET  /review/                                   the page (HTML); /review/static/<file>: its JS and CSS
    GET  /api/gates[?dag_id=&run_id=]               open review gates the user may read
    GET  /api/gates/{dag_id}/{run_id}               the run's gate (open, else its last one) and rounds
    GET  /api/gates/{dag_id}/{run_id}/summary       counts, reason groups, trend       [?round=]
    GET  /api/gates/{dag_id}/{run_id}/trend.svg     the trend plot (image/svg+xml)
    GET  /api/gates/{dag_id}/{run_id}/page          ?cursor=&size=&group=&text=&round=
    GET  /api/gates/{dag_id}/{run_id}/sample        ?n=&seed=&round=
    GET  /api/gates/{dag_id}/{run_id}/sample/{id}   one sample by id                    [?round=]
    GET  /api/gates/{dag_id}/{run_id}/field         ?shard=&position=&path=[&round=]: one value whole
    GET  /api/gates/{dag_id}/{run_id}/attempts/{id} the id's rows in the earlier rounds   [?round=]
    GET  /api/gates/{dag_id}/{run_id}/image         ?shard=&position=&index=[&round=]: a data: image
    GET  /api/gates/{dag_id}/{run_id}/shards        ?cursor=&size=&state=&round=: a round's shards
    GET  /api/gates/{dag_id}/{run_id}/decisions     the decisions so far and their tally
    GET  /api/gates/{dag_id}/{run_id}/calibration   the judge against the reviewers   [?round=]
    GET  /api/gates/{dag_id}/{run_id}/calibration.svg  its plot, the rounds so far (image/svg+xml)
    POST /api/gates/{dag_id}/{run_id}/decisions     {"action", "ids" | "filter", "note"} (open gate only)

Every sample they return is cut to the ``[batchinfer] review_*`` caps as its row is read
(:mod:`airflow_batchinfer.review.bounds`): its ``truncated`` names what was cut, and ``field`` reads
one such value whole (a sample's ``shard_id`` and ``position`` address it).
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_batchinfer.exceptions import BatchInferError, ReviewError
from airflow_batchinfer.review.routes import (
    calibration,
    decisions,
    fields,
    gates,
    images,
    pages,
    rounds,
    shards,
)
from airflow_batchinfer.review.routes.host import DeskHost, access, decide_dag, read_dag
from airflow_batchinfer.review.routes.pages import LOGIN_PAGE, PAGE_CSP

__all__ = ["create_app"]

ROUTERS = (pages, gates, rounds, fields, images, shards, calibration, decisions)


def create_app(host: DeskHost) -> FastAPI:
    """The desk's app on ``host``'s login, permissions and gates."""
    app = FastAPI(
        title="Batch inference review desk",
        dependencies=[Depends(host.user)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.dependency_overrides.update(host.overrides)
    app.dependency_overrides[access] = host.access
    app.dependency_overrides[read_dag] = host.read_dag
    app.dependency_overrides[decide_dag] = host.decide_dag
    _answer_errors(app)

    @app.middleware("http")
    async def _headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    for module in ROUTERS:
        app.include_router(module.router)
    return app


def _answer_errors(app: FastAPI) -> None:
    """Every error as ``{"detail": ...}`` with its status (the page shows the detail), but a visitor
    not signed in on the page itself, who reads how to sign in."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
            for e in exc.errors()
        ]
        return JSONResponse({"detail": "; ".join(errors) or "bad request"}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 401 and request.url.path.rstrip("/").endswith("/review"):
            return HTMLResponse(LOGIN_PAGE, status_code=401, headers={"Content-Security-Policy": PAGE_CSP})
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ReviewError)
    async def _review_error(request: Request, exc: ReviewError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)  # a bad cursor, count, filter, ...

    @app.exception_handler(BatchInferError)
    async def _batchinfer_error(request: Request, exc: BatchInferError) -> JSONResponse:
        # a document of a version this code does not know, a run root that is not a run, ...
        return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=409)

    @app.exception_handler(OSError)
    async def _storage_error(request: Request, exc: OSError) -> JSONResponse:
        return JSONResponse({"detail": f"storage: {type(exc).__name__}: {exc}"}, status_code=502)
