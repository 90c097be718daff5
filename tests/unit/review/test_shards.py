"""The desk's shards view (airflow_batchinfer/review/shards.py) over a round's real documents: its
pages, their cursor (a plan position, valid while lanes change the states between two pages), the
state filter and the cut of a long error. No Airflow: the app's route is tested in
test_shards_app.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ReviewError
from airflow_batchinfer.review.bounds import Bounds
from airflow_batchinfer.review.shards import MAX_SHARDS_PAGE, shard_page
from airflow_batchinfer.run.lanes import claim_shard
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, read_lane, write_lane
from airflow_batchinfer.state.docs.shard_status import round_status
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import plan_round
from tests.support.lane_rounds import lanes_run

LONG = "Traceback (most recent call last):\n" + "  File ...\n" * 200 + "RuntimeError: é"


def in_progress(tmp_path: Path) -> tuple[RunConfig, Plan]:
    """Round 0 of 10 shards under way: lane 0 ended shards 0 (done) and 2 (failed, a long error) and
    runs 4; lane 1 ended 1 and 3 and claimed 5; shards 6 to 9 are unclaimed."""
    cfg = lanes_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    ids = [s.shard_id for s in plan.shards]
    write_lane(layout, LaneDoc(round=0, slot="round-00", lane=0, lanes=2, shards=[
        LaneShard(shard_id=ids[0], records=3, state="done", claimed_at=100.0, ended_at=103.0),
        LaneShard(shard_id=ids[2], records=3, state="failed", claimed_at=103.0, ended_at=104.0, error=LONG),
        LaneShard(shard_id=ids[4], records=3, state="running", claimed_at=104.0),
    ]))  # fmt: skip
    write_lane(layout, LaneDoc(round=0, slot="round-00", lane=1, lanes=2, claiming=ids[5], shards=[
        LaneShard(shard_id=ids[1], records=3, state="done", claimed_at=100.0, ended_at=101.0),
        LaneShard(shard_id=ids[3], records=3, state="done", claimed_at=101.0, ended_at=102.0),
    ]))  # fmt: skip
    for k in range(6):
        assert claim_shard(layout, 0, ids[k], k % 2)
    return cfg, plan


def test_pages_follow_their_cursor_through_the_plan(tmp_path: Path) -> None:
    cfg, plan = in_progress(tmp_path)
    status = round_status(RunLayout(cfg.run_root), plan)
    seen, cursor, pages = [], None, 0
    while True:
        page = shard_page(status, cursor=cursor, size=4)
        seen += [(s["shard_id"], s["state"], s["lane"]) for s in page.shards]
        pages += 1
        assert page.matching == 10
        if page.cursor is None:
            break
        cursor = page.cursor
    ids = [s.shard_id for s in plan.shards]
    assert pages == 3
    assert seen == [
        (ids[0], "done", 0), (ids[1], "done", 1), (ids[2], "failed", 0), (ids[3], "done", 1),
        (ids[4], "running", 0), (ids[5], "claimed", 1),
        *((ids[k], "unclaimed", None) for k in range(6, 10)),
    ]  # fmt: skip
    first = shard_page(status, size=1).shards[0]
    assert first == {
        "shard_id": ids[0], "index": 0, "records": 3, "state": "done", "group": "done", "lane": 0,
        "claimed_at": 100.0, "ended_at": 103.0, "error": None, "quarantine": None, "truncated": {},
    }  # fmt: skip


def test_the_state_filter_and_a_cursor_that_outlives_a_state_change(tmp_path: Path) -> None:
    cfg, plan = in_progress(tmp_path)
    layout = RunLayout(cfg.run_root)
    ids = [s.shard_id for s in plan.shards]
    status = round_status(layout, plan)
    assert [s["shard_id"] for s in shard_page(status, state="failed").shards] == [ids[2]]
    assert [s["shard_id"] for s in shard_page(status, state="unfinished").shards] == [ids[4], ids[5]]
    assert [s["shard_id"] for s in shard_page(status, state="claimed").shards] == [ids[5]]
    never = shard_page(status, state="unclaimed", size=2)
    assert [s["shard_id"] for s in never.shards] == ids[6:8] and never.matching == 4
    # lane 0 ends shard 4 and takes shard 6 before the next page is asked for
    doc = read_lane(layout, 0, 0)
    assert doc is not None
    doc.shards[2].state, doc.shards[2].ended_at = "done", 105.0
    doc.shards.append(LaneShard(shard_id=ids[6], records=3, state="running", claimed_at=105.0))
    write_lane(layout, doc)
    later = shard_page(round_status(layout, plan), state="unclaimed", cursor=never.cursor, size=2)
    assert [s["shard_id"] for s in later.shards] == ids[8:10]  # none skipped, none repeated
    assert later.cursor is None and later.matching == 3


def test_a_long_error_is_cut_to_the_desks_field_bytes_and_says_so(tmp_path: Path) -> None:
    cfg, plan = in_progress(tmp_path)
    status = round_status(RunLayout(cfg.run_root), plan)
    [failed] = shard_page(status, state="failed", bounds=Bounds(field_bytes=256)).shards
    assert failed["error"] == LONG[:256] and failed["truncated"] == {"error": len(LONG.encode())}
    [whole] = shard_page(status, state="failed").shards
    assert whole["error"] == LONG and whole["truncated"] == {}


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"size": 0}, "size must be"),
        ({"size": MAX_SHARDS_PAGE + 1}, "size must be"),
        ({"cursor": "s0:1"}, "cursor 's0:1' is not one this page returned"),
        ({"state": "lost"}, "state 'lost' is not one of"),
    ],
)
def test_bad_requests_are_refused_by_name(tmp_path: Path, kwargs: dict[str, object], says: str) -> None:
    cfg, plan = in_progress(tmp_path)
    status = round_status(RunLayout(cfg.run_root), plan)
    with pytest.raises(ReviewError, match=says):
        shard_page(status, **kwargs)  # type: ignore[arg-type]
