"""The settings a shard's job runs: run.json's, or those of the plan its descriptor names (``slot``,
only when a review changed the round's settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run import jobs
from airflow_batchinfer.run.jobs import job_spec, shard_config
from airflow_batchinfer.state.config import round_config
from airflow_batchinfer.state.docs import Plan, read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import ShardDescriptor
from airflow_batchinfer.storage.location import StorageOptions
from tests.support.fake_jobs import make_run, plan_round


def test_a_shard_of_a_changed_round_runs_the_settings_its_plan_carries(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, sampling={"temperature": 0.7})
    plan = plan_round(cfg)
    unchanged: ShardDescriptor = {**plan.shards[0], "round": 0}  # an unchanged round's: no slot
    assert shard_config(cfg, unchanged) is cfg
    plan.settings = {"temperature": 1.3}
    plan.config = round_config(cfg, plan.settings)
    write_plan(RunLayout(cfg.run_root), plan)
    shard: ShardDescriptor = {**unchanged, "slot": plan.slot}
    changed = shard_config(cfg, shard)
    assert changed.sampling == {"temperature": 1.3} and cfg.sampling == {"temperature": 0.7}
    assert job_spec(changed, "infer_judge", 0, shard).job_id != job_spec(cfg, "infer_judge", 0, shard).job_id


def test_a_descriptor_without_a_slot_reads_no_plan_and_a_missing_plan_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    reads: list[str] = []

    def counted(layout: RunLayout, slot: str, so: StorageOptions | None = None) -> Plan | None:
        reads.append(slot)
        return read_plan(layout, slot, so)

    monkeypatch.setattr(jobs, "read_plan", counted)
    assert shard_config(cfg, {**plan.shards[0], "round": 0}) is cfg
    assert reads == []  # plan.json holds every shard's descriptor: a task of an unchanged round skips it
    with pytest.raises(ConfigError, match=r"slot round-01 has no plan.json.*clear that plan task"):
        shard_config(cfg, {**plan.shards[0], "round": 1, "slot": "round-01"})
    assert reads == ["round-01"]
