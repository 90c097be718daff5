"""One sample's value whole (``/field``: what its ``truncated`` names, read from the sample's shard and
position) and the sample's rows in the rounds before (``/attempts/{id}``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response

from airflow_batchinfer.review.bounds import Bounds, json_text, utf8_size
from airflow_batchinfer.review.decisions import DecisionLog, Resolver
from airflow_batchinfer.review.routes.context import (
    MAX_TEXT,
    RunContext,
    jsonable,
    round_of,
    run_context,
    so_key,
    view,
)
from airflow_batchinfer.review.routes.host import AccessDep, ReadDag
from airflow_batchinfer.review.samples import Sample, field_value
from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION

MAX_FIELD_PATH = 20_000  # characters of a field's path (record.<key>: keys up to review_field_bytes)
# Rows an attempts lookup reads at most, over all the earlier rounds (no index maps an id to its
# shard in an earlier round: recompaction and review decisions move it), and lookups kept.
ATTEMPTS_ROW_BUDGET, MAX_ATTEMPTS_CACHED = 1_000_000, 256
Round = Annotated[int | None, Query(ge=0)]

router = APIRouter(prefix="/api/gates/{dag_id}/{run_id}", dependencies=[ReadDag])


@router.get("/field")
def whole_field(
    dag_id: str,
    run_id: str,
    access: AccessDep,
    shard: Annotated[str, Query(min_length=1, max_length=MAX_TEXT)],
    position: Annotated[int, Query(ge=0)],
    path: Annotated[str, Query(min_length=1, max_length=MAX_FIELD_PATH)],
    round: Round = None,
) -> Response:
    """One value of a sample whole (what its ``truncated`` names), up to review_whole_field_bytes:
    the sample is addressed by its ``shard_id`` and ``position`` (read straight from there)."""
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    found = view(ctx, r).at(shard, position)
    if found is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no sample at {shard!r} position {position} in round {r}"
        )
    return _whole(found, path, r, access.bounds())


@router.get("/attempts/{sample_id:path}")
def attempts(
    dag_id: str, run_id: str, sample_id: str, access: AccessDep, round: Round = None
) -> dict[str, Any]:
    """The rows of ``sample_id`` in the rounds before ``round`` (the gate's by default), newest
    first: each earlier attempt's prompt as sent, output, verdict, reason and score (a jury's
    members), and ``sent_back``: the retry decision that sent it on, when one did. Reads at most
    :data:`ATTEMPTS_ROW_BUDGET` rows (``complete``: every earlier round was searched to its end
    or to the id)."""
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    if not sample_id or len(sample_id) > MAX_FIELD_PATH:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"a sample id has 1 to {MAX_FIELD_PATH:,} characters"
        )
    return _attempts(ctx, r, sample_id, access.bounds())


def _whole(sample: Sample, path: str, r: int, bounds: Bounds) -> Response:
    """``path``'s value of ``sample``, whole: ``{round, shard_id, position, path, bytes, value}``
    (``bytes``: its UTF-8 size, as text or as JSON), or 413 past ``bounds.whole_field_bytes``."""
    value = field_value(sample, path)  # an unknown path: ReviewError, a 400
    text = value if isinstance(value, str) else json_text(value)
    size = utf8_size(text)
    if size > bounds.whole_field_bytes:
        raise HTTPException(
            413,  # content too large (its name in starlette changed across the versions we support)
            f"{path[:200]} of the sample at {sample.shard_id} position {sample.position} (round {r}) is "
            f"{size} bytes, more than [{CONFIG_SECTION}] review_whole_field_bytes = "
            f"{bounds.whole_field_bytes}: read it from the round's rejected file in storage, or raise "
            "the setting",
        )
    doc = {
        "round": r,
        "shard_id": sample.shard_id,
        "position": sample.position,
        "path": path,
        "bytes": size,
        "value": value,
    }
    return Response(orjson.dumps(doc), media_type="application/json")


_attempts_cache: OrderedDict[tuple[str, int, str, str], dict[str, Any]] = OrderedDict()
_attempts_lock = threading.Lock()


def _attempts(ctx: RunContext, r: int, sample_id: str, bounds: Bounds) -> dict[str, Any]:
    """:func:`attempts`' answer: round ``r-1`` down to 0, each searched for the id until found (an
    id is in a round's rejected rows at most once) or until the rows read reach
    :data:`ATTEMPTS_ROW_BUDGET` (checked before each block of a shard: the last block read may pass
    it); a closed round's rows do not change, so an answer is kept."""
    key = (ctx.run_root, r, sample_id, f"{so_key(ctx)} {bounds!r}")
    with _attempts_lock:
        hit = _attempts_cache.get(key)
    if hit is not None:
        return hit
    found: list[dict[str, Any]] = []
    searched: list[int] = []
    read = 0
    complete = True
    for earlier in range(r - 1, -1, -1):
        sample, rows, whole = view(ctx, earlier).find_within(sample_id, max(ATTEMPTS_ROW_BUDGET - read, 0))
        read += rows
        if not whole:
            complete = False
            break
        searched.append(earlier)
        if sample is not None:
            found.append(jsonable(_with_sent_back(ctx, earlier, sample).bounded(bounds)))
    doc = {
        "round": r,
        "id": sample_id,
        "attempts": found,  # newest first: the rows of the rounds before r
        "searched": searched,
        "complete": complete,
        "rows_read": read,
        "row_budget": ATTEMPTS_ROW_BUDGET,
    }
    with _attempts_lock:
        _attempts_cache[key] = doc
        while len(_attempts_cache) > MAX_ATTEMPTS_CACHED:
            _attempts_cache.popitem(last=False)
    return doc


def _with_sent_back(ctx: RunContext, r: int, sample: Sample) -> Sample:
    """Round ``r``'s ``sample`` with the retry decision that sent it back to the next round (its
    ``sent_back``, as the decisions' application marked its pending row), when one did: the note its
    next attempt may have been told."""
    decision = Resolver(DecisionLog(ctx.run_root, r, ctx.so).read()).decision(sample)
    if decision is None or decision.action != "retry":
        return sample
    return replace(sample, sent_back=decision.sent_back())
