"""The lane's driver without sockets: the settings its round runs, the clients it makes for the run's
pool and a judge's own pool, what a stopped lane tells its task."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run import lane_driver
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.lane_driver import (
    TrackedPoolClient,
    drive_lane,
    lane_event,
    lane_failure_message,
    lane_round,
)
from airflow_batchinfer.run.lanes import Lane
from airflow_batchinfer.state.config import RunConfig, round_config
from airflow_batchinfer.state.docs import Plan, write_plan, write_run_config
from airflow_batchinfer.state.docs.lanes import LaneDoc
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import make_run, plan_round


def pool(url: str, token: str) -> Any:
    return SimpleNamespace(workers=lambda lease_id=None: [url], token=lambda: token)


async def test_a_judge_with_its_own_pool_judges_from_the_same_lane_on_a_client_of_its_own(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """As ``batchinfer run``: each shard's infer job on the run's pool, then its judge job on the
    judge's; both clients tracked (a killed lane cancels either job) and closed when the lane ends."""
    cfg = make_run(tmp_path, judge_pool="local://judge")
    write_run_config(cfg)
    plan = plan_round(cfg)
    opened: list[str] = []
    seen: dict[str, TrackedPoolClient] = {}

    async def open_pool(ref: str) -> Any:
        opened.append(ref)
        return pool("http://judge:1", "jtok")

    async def run_lane(lane: Lane, cfg_: RunConfig, plan_: Plan, pools: Any, **_: Any) -> LaneDoc:
        seen.update(pools)
        return LaneDoc(round=0, slot=plan_.slot, lane=lane.index, lanes=lane.count, finished=True)

    monkeypatch.setattr(lane_driver, "run_lane", run_lane)
    tracked: list[TrackedPoolClient] = []
    await drive_lane(
        Lane(plan.slot, 0, 0, 1),
        cfg.run_root,
        pool("http://run:1", "tok"),
        so=None,
        logger=logging.getLogger("test"),
        open_pool=open_pool,
        client_args={"lease_id": "d/r", "job_timeout_s": 5.0},
        tracked=tracked,
    )
    assert opened == ["local://judge"] and sorted(seen) == ["infer", "judge"]
    assert (list(seen["infer"].clients), seen["infer"].token) == (["http://run:1"], "tok")
    assert (list(seen["judge"].clients), seen["judge"].token) == (["http://judge:1"], "jtok")
    assert tracked == [seen["infer"], seen["judge"]] and {c.job_timeout_s for c in tracked} == {5.0}


def test_a_stopped_lanes_event_names_the_lane_the_shard_and_the_remedy() -> None:
    event = lane_event(Lane("round-01", 1, 2, 4), "part-00007", OSError("gone"))
    assert event == {
        "state": "error",
        "slot": "round-01",
        "lane": 2,
        "lanes": 4,
        "shard": "part-00007",
        "error": "OSError: gone",
    }
    message = lane_failure_message(event)
    assert message.startswith(
        "lane 2 of round-01 (4 lanes) stopped on shard part-00007: error: OSError: gone"
    )
    assert "takes shard part-00007 back first" in message
    assert "before taking a shard" in lane_failure_message(lane_event(Lane("tail", 3, 0, 1), None, "x"))


def test_a_lane_runs_its_rounds_settings_run_jsons_or_those_a_review_gave_the_round(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, sampling={"temperature": 0.7})
    write_run_config(cfg)
    plan = plan_round(cfg)
    lane = Lane(plan.slot, 0, 0, 1)
    assert lane_round(cfg.run_root, lane)[0].prompt.sampling == {"temperature": 0.7}
    plan.settings = {"temperature": 1.3}
    plan.config = round_config(cfg, plan.settings)
    write_plan(RunLayout(cfg.run_root), plan)
    changed, _ = lane_round(cfg.run_root, lane)
    assert changed.prompt.sampling == {"temperature": 1.3}
    shard = plan.shards[0].model_copy(update={"round": 0})
    assert job_spec(changed, "infer_judge", 0, shard).job_id != job_spec(cfg, "infer_judge", 0, shard).job_id
    with pytest.raises(ConfigError, match=r"slot round-01 has no plan.json.*clear that plan task"):
        lane_round(cfg.run_root, Lane("round-01", 1, 0, 1))
