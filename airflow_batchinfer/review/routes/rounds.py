"""A closed round's rejected rows: its counts, reason groups and the run's trend (``/summary``,
``/trend.svg``), a page of them, filtered or not (``/page``), a seeded random sample (``/sample``)
and one by id (``/sample/{id}``). Every sample is cut to the host's caps as its row is read."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response

from airflow_batchinfer.review.routes.context import MAX_TEXT, jsonable, round_of, run_context, view
from airflow_batchinfer.review.routes.host import AccessDep, ReadDag
from airflow_batchinfer.review.routes.pages import SVG_CSP
from airflow_batchinfer.review.trends import trend, trend_chart
from airflow_batchinfer.state.docs import read_summary
from airflow_batchinfer.state.layout import RunLayout

MAX_PAGE = 200  # rows per page, and samples per draw
Round = Annotated[int | None, Query(ge=0)]

router = APIRouter(prefix="/api/gates/{dag_id}/{run_id}", dependencies=[ReadDag])


@router.get("/summary")
def summary(dag_id: str, run_id: str, access: AccessDep, round: Round = None) -> dict[str, Any]:
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    found = view(ctx, r)
    groups = found.groups()
    doc = read_summary(RunLayout(ctx.run_root), r, ctx.so)
    stored = doc.to_json() if doc is not None else {}  # a mode's own counts: in place has no rejected
    shown = ("pending", "approved", "rejected", "failed_records", "spot_checks")
    counts = {k: stored[k] for k in shown if k in stored}
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "round": r,
        "gate_round": ctx.round,
        "total": found.total(),
        "counts": counts,
        "groups": [{"group": g, "count": n} for g, n in groups.items()],  # most common first
        "trend": trend(ctx.run_root, so=ctx.so),
    }


@router.get("/trend.svg")
def trend_svg(dag_id: str, run_id: str, access: AccessDep) -> Response:
    ctx = run_context(access, dag_id, run_id)
    svg = trend_chart(trend(ctx.run_root, so=ctx.so))
    return Response(svg, media_type="image/svg+xml", headers={"Content-Security-Policy": SVG_CSP})


@router.get("/page")
def browse(
    dag_id: str,
    run_id: str,
    access: AccessDep,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
    size: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    group: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
    text: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
    round: Round = None,
) -> dict[str, Any]:
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    page = view(ctx, r).page(
        cursor or None, size=size, group=group or None, text=text or None, bounds=access.bounds()
    )
    return {
        "round": r,
        "samples": [jsonable(s) for s in page.samples],
        "cursor": page.cursor,
        "scanned": page.scanned,
        "total": page.total,
        "capped": page.capped,  # stopped at review_page_bytes: the cursor goes on from there
    }


@router.get("/sample")
def sample(
    dag_id: str,
    run_id: str,
    access: AccessDep,
    n: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    seed: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    round: Round = None,
) -> dict[str, Any]:
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    found = view(ctx, r)
    samples = found.sample(n=n, seed=seed, bounds=access.bounds())
    capped = len(samples) < min(n, found.total())  # the rest drawn would pass review_page_bytes
    return {"round": r, "seed": seed, "samples": [jsonable(s) for s in samples], "capped": capped}


@router.get("/sample/{sample_id:path}")
def find(dag_id: str, run_id: str, sample_id: str, access: AccessDep, round: Round = None) -> dict[str, Any]:
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    found = view(ctx, r).find(sample_id, bounds=access.bounds())
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no sample {sample_id!r} in round {r}")
    return {"round": r, "sample": jsonable(found)}
