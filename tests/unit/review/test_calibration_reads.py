"""Issue 37, item 8: the desk's live calibration reads only what it needs, counted in rows read.

Before: every request (the page asks after every decision) read every rejected row of the round to
find the few ids the decisions name, inside Airflow's api-server. Now the read stops where the last
named id turns up, and a round's decided rows are kept between requests (``DecidedRows``, one per
shared round view): a request reads only the rows of ids no earlier one looked for.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision
from tests.support.review_rounds import (  # noqa: F401 (fixtures, used by name)
    build_round,
    built,
    rejected_ids,
    view,
)

pytestmark = pytest.mark.security


class Reads:
    rows = 0


def _counted(view: RoundView, monkeypatch: pytest.MonkeyPatch) -> Reads:
    reads, blocks = Reads(), view._blocks

    def counting(shard: Any) -> Generator[tuple[int, list[bytes]], None, None]:
        for start, block in blocks(shard):
            reads.rows += len(block)
            yield start, block

    monkeypatch.setattr(view, "_blocks", counting)
    return reads


def _decide(action: str, *ids: str) -> Decision:
    return Decision.make(0, action, "bob", ids=ids)  # type: ignore[arg-type]


def test_live_calibration_stops_reading_where_the_decided_ids_are_found(
    view: RoundView, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batchinfer.review.calibration import measured

    shards = view.shards()
    assert len(shards) > 1
    reads = _counted(view, monkeypatch)
    first = rejected_ids()[0]  # in the round's first shard
    doc = measured(view, [_decide("accept", first)])
    assert doc.decisions == 1 and doc.reviewed + doc.unjudged == 1
    assert 0 < reads.rows <= shards[0].rows < sum(s.rows for s in shards)


def test_a_rounds_decided_rows_are_read_once_across_requests(
    view: RoundView, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batchinfer.review.calibration import DecidedRows, measured

    ids = rejected_ids()
    log = [_decide("accept", ids[0]), _decide("drop", ids[-1], "no-such-id")]
    index = DecidedRows()
    whole = measured(view, log)  # without the index: the same figures
    reads = _counted(view, monkeypatch)
    assert measured(view, log, index=index).to_json() == whole.to_json()
    assert reads.rows == sum(s.rows for s in view.shards())  # an id not in the round: read to the end
    reads.rows = 0
    log.append(_decide("retry", ids[0]))  # the page asks again after every decision
    again = measured(view, log, index=index)
    assert reads.rows == 0 and again.decisions == 3  # nothing new to look for: nothing read
    log.append(_decide("accept", ids[1]))
    measured(view, log, index=index)
    assert 0 < reads.rows <= view.shards()[0].rows  # only up to the newly named id
    # a decision by filter needs the rows whole: the index is not used, the figures stay right
    log.append(Decision.make(0, "drop", "bob", filter={"group": "nothing matches"}))
    assert measured(view, log, index=index).to_json()["decisions"] == 5
