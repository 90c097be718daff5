"""The review desk's shards view: a round's shards with their state, lane, records, claim and end
times and error (:mod:`airflow_batchinfer.state.docs.shard_status`), a page at a time, filtered by
state. With lanes the Airflow grid shows one box per lane; this is where a reviewer (or an operator
on the desk) sees each shard.

A page's cursor is the plan position to go on from (``p<index>``): it stays valid while lanes
change the shards' states between two pages. Each error is cut to the desk's ``field_bytes``
(``truncated`` names it, with its whole size), so a page is bounded by its ``size``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ReviewError
from airflow_batchinfer.review.bounds import Bounds, clip
from airflow_batchinfer.state.docs.shard_status import COUNTED, GROUP, RoundStatus, ShardRow

MAX_SHARDS_PAGE = 500  # shards one page returns at most
# What a page filters on: a counted group (unfinished: running and claimed) or one exact state.
STATES = frozenset({*COUNTED, *GROUP})
_CURSOR = re.compile(r"^p(\d+)$")


@dataclass(frozen=True)
class ShardPage:
    """One page of a round's shards: ``cursor`` goes on after it (``None``: the plan's end)."""

    shards: list[dict[str, Any]]
    cursor: str | None
    matching: int  # the shards the filter selects in the whole round

    def to_dict(self) -> dict[str, Any]:
        return {"shards": self.shards, "cursor": self.cursor, "matching": self.matching}


def selects(row: ShardRow, state: str | None) -> bool:
    return state is None or row.state == state or row.group == state


def shard_page(
    status: RoundStatus,
    *,
    cursor: str | None = None,
    size: int = 100,
    state: str | None = None,
    bounds: Bounds | None = None,
) -> ShardPage:
    """``size`` shards of ``status`` from ``cursor`` on (``None``: the start) whose state is
    ``state`` (a state, or a counted group: ``unfinished`` is running and claimed; ``None``: all)."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SHARDS_PAGE:
        raise ReviewError(f"size must be an integer from 1 to {MAX_SHARDS_PAGE}, got {size!r}")
    if state is not None and state not in STATES:
        raise ReviewError(f"state {state[:50]!r} is not one of {', '.join(sorted(STATES))}")
    start = 0
    if cursor:
        m = _CURSOR.match(cursor)
        if m is None:
            raise ReviewError(f"cursor {cursor[:50]!r} is not one this page returned (expected p<index>)")
        start = int(m.group(1))
    limit = (bounds or Bounds()).field_bytes
    rows = status.rows
    out: list[dict[str, Any]] = []
    index = start
    while index < len(rows) and len(out) < size:
        row = rows[index]
        index += 1
        if selects(row, state):
            out.append(_shown(row, limit))
    more = any(selects(r, state) for r in rows[index:])
    matching = sum(1 for r in rows if selects(r, state))
    return ShardPage(out, f"p{index}" if more else None, matching)


def _shown(row: ShardRow, limit: int) -> dict[str, Any]:
    doc = row.model_dump(mode="json")
    doc["group"] = row.group
    doc["truncated"] = {}
    if row.error is not None:
        doc["error"], whole = clip(row.error, limit)
        if whole is not None:
            doc["truncated"] = {"error": whole}
    return doc
