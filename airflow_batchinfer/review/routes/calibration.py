"""The judge against the reviewers (``/calibration``: a round as its decisions stand now, and every
round up to it) and its plot over the rounds so far (``/calibration.svg``)."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.calibration import DecidedRows, calibration_chart, measured, scored_in_tenths
from airflow_batchinfer.review.decisions import DecisionLog
from airflow_batchinfer.review.routes.context import (
    MAX_VIEWS,
    RunContext,
    round_of,
    run_context,
    so_key,
    view,
)
from airflow_batchinfer.review.routes.host import AccessDep, ReadDag
from airflow_batchinfer.review.routes.pages import SVG_CSP
from airflow_batchinfer.state.docs import read_run_config
from airflow_batchinfer.state.docs.calibration import Calibration, read_calibration
from airflow_batchinfer.state.layout import RunLayout

router = APIRouter(prefix="/api/gates/{dag_id}/{run_id}", dependencies=[ReadDag])


@router.get("/calibration")
def calibration(
    dag_id: str, run_id: str, access: AccessDep, round: Annotated[int | None, Query(ge=0)] = None
) -> dict[str, Any]:
    """The judge against the reviewers: round ``round`` (the gate's by default) as its decisions
    stand now (``live``), and every round up to it (stored once applied, else live)."""
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    docs = _calibrations(ctx, r)
    return {
        "round": r,
        "gate_round": ctx.round,
        "calibration": docs[-1][0].to_json(),
        "live": docs[-1][1],
        "rounds": [{**doc.to_json(), "live": live} for doc, live in docs],
    }


@router.get("/calibration.svg")
def calibration_svg(dag_id: str, run_id: str, access: AccessDep) -> Response:
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, None)
    svg = calibration_chart([doc for doc, _ in _calibrations(ctx, r)])
    return Response(svg, media_type="image/svg+xml", headers={"Content-Security-Policy": SVG_CSP})


_calibrated: OrderedDict[tuple[str, int, int, str], Calibration] = OrderedDict()
_calibrated_lock = threading.Lock()
# each shared round view's decided rows, read once across requests (they go with the view)
_decided: weakref.WeakKeyDictionary[RoundView, DecidedRows] = weakref.WeakKeyDictionary()


def _decided_rows(round_view: RoundView) -> DecidedRows:
    with _calibrated_lock:
        return _decided.setdefault(round_view, DecidedRows())


def _calibrations(ctx: RunContext, r: int) -> list[tuple[Calibration, bool]]:
    """Rounds ``0..r``'s calibrations, each with whether it is live: the stored one of a round whose
    decisions took effect, else measured from the decisions so far (once per state of the log: the
    page asks after every decision)."""
    layout = RunLayout(ctx.run_root)
    out = []
    for q in range(r + 1):
        stored = read_calibration(layout, q, ctx.so)
        if stored is not None:
            out.append((stored, False))
            continue
        log = DecisionLog(ctx.run_root, q, ctx.so).read()
        if q < r and not log:
            continue  # an earlier round nobody reviewed
        key = (ctx.run_root, q, len(log), so_key(ctx))
        with _calibrated_lock:
            hit = _calibrated.get(key)
        if hit is None:
            tenths = scored_in_tenths(read_run_config(ctx.run_root, ctx.so).judging.judge)
            round_view = view(ctx, q)
            hit = measured(round_view, log, tenths=tenths, index=_decided_rows(round_view))
            with _calibrated_lock:
                _calibrated[key] = hit
                while len(_calibrated) > MAX_VIEWS:
                    _calibrated.popitem(last=False)
        out.append((hit, True))
    return out
