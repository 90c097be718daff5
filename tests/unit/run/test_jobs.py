"""The settings a shard's job runs: those of the plan its descriptor names (``slot``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.config import round_config
from airflow_batchinfer.run.docs import write_plan
from airflow_batchinfer.run.jobs import job_spec, shard_config
from airflow_batchinfer.run.layout import RunLayout
from airflow_batchinfer.storage import ShardDescriptor
from tests.support.fake_jobs import make_run, plan_round


def test_a_shard_runs_the_settings_its_plan_carries(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, sampling={"temperature": 0.7})
    plan = plan_round(cfg)
    shard: ShardDescriptor = {**plan.shards[0], "round": 0, "slot": plan.slot}
    assert shard_config(cfg, shard) == cfg  # unchanged: run.json's, the same job
    assert (
        job_spec(shard_config(cfg, shard), "infer_judge", 0, shard).job_id
        == job_spec(cfg, "infer_judge", 0, shard).job_id
    )
    plan.settings = {"temperature": 1.3}
    plan.config = round_config(cfg, plan.settings)
    write_plan(RunLayout(cfg.run_root), plan)
    changed = shard_config(cfg, shard)
    assert changed.sampling == {"temperature": 1.3} and cfg.sampling == {"temperature": 0.7}
    assert job_spec(changed, "infer_judge", 0, shard).job_id != job_spec(cfg, "infer_judge", 0, shard).job_id


def test_a_descriptor_without_a_slot_runs_run_json_and_a_missing_plan_is_an_error(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    # returned before every descriptor named its slot: only a changed round's did
    assert shard_config(cfg, {**plan.shards[0], "round": 0}) is cfg
    with pytest.raises(ConfigError, match=r"slot round-01 has no plan.json.*clear that plan task"):
        shard_config(cfg, {**plan.shards[0], "round": 1, "slot": "round-01"})
