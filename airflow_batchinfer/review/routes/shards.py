"""A round's shards (``/shards``): a page of them with the round's counts by state, from its lanes'
documents, claims and quarantine records; a round in progress too."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from airflow_batchinfer.review.routes.context import (
    MAX_TEXT,
    MAX_VIEWS,
    VIEW_TTL_S,
    RunContext,
    run_context,
    so_key,
)
from airflow_batchinfer.review.routes.host import AccessDep, ReadDag
from airflow_batchinfer.review.shards import MAX_SHARDS_PAGE, shard_page
from airflow_batchinfer.state.docs import Plan, read_plan, read_run_config, read_summary, slots
from airflow_batchinfer.state.docs.shard_status import RoundStatus, round_status
from airflow_batchinfer.state.layout import RunLayout

SHARDS_TTL_S = 5.0  # an open round's shard states are read again after this (a closed one's: VIEW_TTL_S)

router = APIRouter()


@router.get("/api/gates/{dag_id}/{run_id}/shards", dependencies=[ReadDag])
def shards(
    dag_id: str,
    run_id: str,
    access: AccessDep,
    cursor: Annotated[str | None, Query(max_length=100)] = None,
    size: Annotated[int, Query(ge=1, le=MAX_SHARDS_PAGE)] = 100,
    state: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
    round: Annotated[int | None, Query(ge=0)] = None,
) -> dict[str, Any]:
    """A page of a round's shards (its lanes' documents, claims and quarantine records) with
    the round's counts by state (a round no lane has started: every shard unclaimed)."""
    ctx = run_context(access, dag_id, run_id)
    plan, rounds = _planned(ctx, round)
    found, closed = _round_status(ctx, plan)
    page = shard_page(found, cursor=cursor or None, size=size, state=state or None, bounds=access.bounds())
    return {
        "round": plan.round,
        "slot": plan.slot,
        "rounds": rounds,  # the rounds planned so far (each one's shards can be shown)
        "gate_round": ctx.round,
        "closed": closed,
        "lanes": len(found.lane_docs),
        "total": len(found.rows),
        "counts": found.counts(),
        **page.to_dict(),
    }


def _planned(ctx: RunContext, requested: int | None) -> tuple[Plan, list[int]]:
    """The plan of the round whose shards to show, and every round that has one (not skipped):
    ``requested``, else the gate's round, else the last round planned (one that runs now). A round
    in progress is shown too: its shards' states are what its lanes have written so far."""
    layout = RunLayout(ctx.run_root)
    cfg = read_run_config(ctx.run_root, ctx.so)
    plans: dict[int, Plan] = {}
    for slot in slots(cfg.retries.max_rounds):
        plan = read_plan(layout, slot, ctx.so)
        if plan is not None and plan.mode != "skip":
            plans[plan.round] = plan
    rounds = sorted(plans)
    r = requested
    if r is None:
        r = ctx.round if ctx.round in plans else (rounds[-1] if rounds else None)
    if r is None or r not in plans:
        what = "no round has been planned yet" if r is None else f"round {r} has not been planned"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{ctx.dag_id}/{ctx.run_id}: {what}")
    return plans[r], rounds


_statuses: OrderedDict[tuple[str, int, str], tuple[float, RoundStatus, bool]] = OrderedDict()
_statuses_lock = threading.Lock()


def _round_status(ctx: RunContext, plan: Plan) -> tuple[RoundStatus, bool]:
    """The round's shard states and whether it has closed, shared between requests for a while: a
    page and its next page read the lane documents once (O(lanes) documents), an open round's
    again after :data:`SHARDS_TTL_S`."""
    key = (ctx.run_root, plan.round, so_key(ctx))
    now = time.monotonic()
    with _statuses_lock:
        hit = _statuses.get(key)
    if hit and now - hit[0] < (VIEW_TTL_S if hit[2] else SHARDS_TTL_S) and hit[1].plan == plan:
        return hit[1], hit[2]
    layout = RunLayout(ctx.run_root)
    summary = read_summary(layout, plan.round, ctx.so)
    found = round_status(layout, plan, ctx.so, failed=None if summary is None else summary.failed_shards)
    with _statuses_lock:
        _statuses[key] = (now, found, summary is not None)
        _statuses.move_to_end(key)
        while len(_statuses) > MAX_VIEWS:
            _statuses.popitem(last=False)
    return found, summary is not None
