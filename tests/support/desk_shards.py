"""Runs run by lanes behind the review desk's app: the shards view's app and browser tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batchinfer.run.lanes import claim_shard
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, write_lane
from airflow_batchinfer.state.layout import RunLayout
from tests.support import desk as t
from tests.support.fake_jobs import close, plan_round
from tests.support.lane_rounds import FinishingPool, lanes_run, run_lanes

FAILING = "part-00004"


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[t.Desk]:
    """The desk's app with four DAG runs: ``lanes`` (its gate reviews round 0, run by lanes, and
    waits), ``moving`` (the same, its gate answered and round 1 under way), ``before`` (its round 0
    closed with no lane document: no lane started it), ``broken`` (as ``moving``, a lane document of
    round 1 unreadable)."""
    roots = {
        "lanes": lanes_runs(tmp_path_factory.mktemp("lanes"))[0].run_root,
        "moving": lanes_runs(tmp_path_factory.mktemp("moving"))[0].run_root,
        "before": t.closed_run(tmp_path_factory.mktemp("before")).run_root,
        "broken": lanes_runs(tmp_path_factory.mktemp("broken"))[0].run_root,
    }
    # a lane document this release cannot read (another release's field)
    bad = Path(RunLayout(roots["broken"]).lane(1, 1))
    bad.write_text(json.dumps({**json.loads(bad.read_text()), "surprise": True}))
    with t.desk_with_runs(tmp_path_factory, roots, answered={"moving"}) as desk:
        yield desk


def lanes_runs(base: Path) -> tuple[RunConfig, list[str]]:
    """Round 0 (10 shards, 3 lanes, ``FAILING``'s job fails) closed; round 1 (the 15 rejected
    records in 5 shards) under way: lane 0 ended its first shard and runs its second, lane 1
    claimed one it has not recorded, the other two never claimed. Returns the run and round 1's ids."""
    cfg = lanes_run(base, review="every_round", max_rounds=3)
    write_run_config(cfg)
    plan = plan_round(cfg)
    run_lanes(cfg, plan, 3, FinishingPool(cfg, plan, EVEN, fail={FAILING}))
    close(cfg, plan)
    layout = RunLayout(cfg.run_root)
    nxt = plan_round(cfg, "round-01")
    ids = [s.shard_id for s in nxt.shards]
    write_lane(layout, LaneDoc(round=1, slot="round-01", lane=0, lanes=2, shards=[
        LaneShard(shard_id=ids[0], records=3, state="done", claimed_at=T0, ended_at=T0 + 4.5),
        LaneShard(shard_id=ids[2], records=3, state="running", claimed_at=T0 + 4.5),
    ]))  # fmt: skip
    write_lane(layout, LaneDoc(round=1, slot="round-01", lane=1, lanes=2, claiming=ids[1]))
    for sid, lane in ((ids[0], 0), (ids[2], 0), (ids[1], 1)):
        assert claim_shard(layout, 1, sid, lane)
    return cfg, ids


EVEN = {f"r{i:02d}" for i in range(0, 30, 2)}
T0 = 1_780_000_000.0  # round 1's first claim (Unix seconds)
