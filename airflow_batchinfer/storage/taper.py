"""Shard sizes that taper towards the end of a plan, so that a round's lanes end together.

Lanes take shards in plan order, and a GPU idles once its lanes find none left: the round's tail is
the work still running when the last shard is taken, up to a shard per lane at the plan's size.
Smaller shards shorten it, but each shard costs its lane a claim, a submit and a poll. So only the
end of the plan is cut finer (*factoring*, as loop schedulers cut a parallel loop's last
iterations): while more than ``2 × lanes`` full shards remain a shard has the full size; after that
each is the remainder's share, ``remaining / (2 × lanes)``, down to an eighth of the full size
(:data:`FINEST`) and never below ``floor`` (:data:`MIN_RECORDS` records); a remainder smaller than
half that joins the shard before it (up to the full size). With 10 lanes, 100 shards of 10,000
records become 141: 81 of 10,000, then 60 from 9,500 down to 1,250 records; at 100M records on 320
lanes, 5,000 shards of 20,000 become 6,330.

Pure arithmetic, in whatever unit the caller plans (bytes of a file, records):
:func:`~airflow_batchinfer.storage.range_plan.plan_ranges` cuts a file's byte ranges with it, and
:mod:`~airflow_batchinfer.run.sizing` sizes a round's shards the same way.
"""

from __future__ import annotations

FINEST = 8  # the last shards are an eighth of the full size
MIN_RECORDS = 1_000  # no tapered shard is smaller (a lane's few tenths of a second per shard)


def finest(full: float, floor: float = MIN_RECORDS) -> float:
    """The smallest tapered shard (``full`` itself: no taper)."""
    return min(full, max(full / FINEST, floor))


def next_size(remaining: float, full: float, lanes: int, floor: float = 0.0) -> float:
    """The size of the next shard with ``remaining`` left to plan: ``full``, or in the last ``2 ×
    lanes`` full shards the remainder's share (see the module); ``lanes`` 0: no taper."""
    smallest = finest(full, floor)
    if lanes < 1 or smallest >= full:  # no taper: shards of ``floor`` or less are not cut finer
        return full
    size = max(smallest, min(full, remaining / (2 * lanes)))
    return remaining if remaining - size < smallest / 2 and remaining <= full else size


def sizes(total: int, full: int, lanes: int, floor: int = MIN_RECORDS) -> list[int]:
    """The sizes (records) of the shards of ``total`` records: ``full`` each, the last ones tapered
    for ``lanes`` lanes (the last shard holds what is left); ``[]`` for nothing."""
    if total <= 0:
        return []
    if lanes < 1 or finest(full, floor) >= full:
        n, rest = divmod(total, full)
        return [full] * n + ([rest] if rest else [])
    body = max(0, (total - 2 * lanes * full) // full)  # full shards, in bulk: only the end is walked
    out = [full] * body
    left = total - body * full
    while left > 0:
        n = min(left, max(1, round(next_size(left, full, lanes, floor))))
        out.append(n)
        left -= n
    return out
