"""The reviewers' decisions on a round: those so far with how many rows each action takes
(``GET /decisions``), and a new one on a selection or a filter, while the gate is open
(``POST /decisions``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, ConfigDict, Field

from airflow_batchinfer.exceptions import ReviewClosedError
from airflow_batchinfer.review.decisions import MAX_IDS, MAX_NOTE, Decision, DecisionLog, Resolver, tally
from airflow_batchinfer.review.routes.context import (
    MAX_TEXT,
    MAX_VIEWS,
    RunContext,
    check_respondent,
    round_of,
    run_context,
    view,
)
from airflow_batchinfer.review.routes.host import AccessDep, DecideDag, ReadDag

TALLY_SCAN_MAX = 200_000  # rows a text filter's tally may read on a request; beyond: at the answer

router = APIRouter()


class DecisionFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str | None = Field(default=None, max_length=MAX_TEXT)
    text: str | None = Field(default=None, max_length=MAX_TEXT)


class DecisionIn(BaseModel):
    """A decision on the selected samples (``ids``) or on every sample matching ``filter``."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "retry", "drop"]
    ids: list[str | int] | None = Field(default=None, max_length=MAX_IDS)
    filter: DecisionFilter | None = None
    note: str = Field(default="", max_length=MAX_NOTE)
    round: int | None = None  # if given, must be the gate's round (a stale page is refused)


@router.get("/api/gates/{dag_id}/{run_id}/decisions", dependencies=[ReadDag])
def decisions(
    dag_id: str, run_id: str, access: AccessDep, round: Annotated[int | None, Query(ge=0)] = None
) -> dict[str, Any]:
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    log = DecisionLog(ctx.run_root, r, ctx.so).read()
    return {
        "round": r,
        "decisions": [d.to_dict() for d in log],
        "tally": _tally(ctx, r, log),  # how many of the round's rows each action takes
        "open": ctx.gate.open and r == ctx.round,
    }


@router.post("/api/gates/{dag_id}/{run_id}/decisions", dependencies=[DecideDag], status_code=201)
def decide(dag_id: str, run_id: str, body: DecisionIn, access: AccessDep) -> dict[str, Any]:
    ctx = run_context(access, dag_id, run_id)
    if not ctx.gate.open:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"{dag_id}/{run_id}: no review gate is open; decisions are recorded only while one waits",
        )
    check_respondent(ctx.gate, access)
    if ctx.round is None:
        raise HTTPException(status.HTTP_409_CONFLICT, "the gate reviews no closed round")
    if body.round is not None and body.round != ctx.round:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"the open gate reviews round {ctx.round}, not round {body.round}: reload the page",
        )
    if (body.ids is None) == (body.filter is None):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "give either ids (the selection) or a filter")
    if body.ids is not None and not body.ids:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "no ids selected")
    flt = None
    if body.filter is not None:
        flt = {k: v for k, v in body.filter.model_dump().items() if v}
    decision = Decision.make(
        ctx.round, body.action, access.user_name, note=body.note, ids=body.ids or (), filter=flt
    )  # validated: a ReviewError is a 400
    log = DecisionLog(ctx.run_root, ctx.round, ctx.so)
    try:
        recorded = log.append(decision)
    except ReviewClosedError as exc:  # the gate was answered after the check above
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    return {"round": ctx.round, "decision": decision.to_dict(), "decisions": len(recorded)}


_tallies: OrderedDict[tuple[str, int, int], dict[str, int]] = OrderedDict()
_tallies_lock = threading.Lock()


def _tally(ctx: RunContext, r: int, log: list[Decision]) -> dict[str, int] | str:
    """How many rows each action takes, once per state of the log (the page asks after every
    decision). A text filter must render and search every row: over a large round that is left to
    the gate's answer, which applies the decisions anyway, and the page says so."""
    key = (ctx.run_root, r, len(log))
    with _tallies_lock:
        if key in _tallies:
            return _tallies[key]
    found = view(ctx, r)
    if Resolver(log).needs_prompts and found.total() > TALLY_SCAN_MAX:
        return f"counted when the gate is answered (a text filter over {found.total():,} rows)"
    counts: dict[str, int] = {str(k): v for k, v in tally(log, found).items()}
    with _tallies_lock:
        _tallies[key] = counts
        while len(_tallies) > MAX_VIEWS:
            _tallies.popitem(last=False)
    return counts
