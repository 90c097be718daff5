"""RunConfig is made of section sub-configs, and flat names stay the contract: a run.json written
before the sections loads, and ``to_dict`` gives back the same flat settings."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.state.config import RunConfig, round_config
from airflow_batchinfer.state.config_sections import DataConfig, RetryConfig, ReviewConfig, ShardingConfig

# run.json as the flat RunConfig wrote it, in its order (schema_version: dropped as read_run_config does)
OLD_RUN_SETTINGS = {
    "input": "s3://b/in.jsonl",
    "run_root": "/runs/r",
    "prompt_template": "Q: {{ q }}",
    "judge": {"type": "llm", "max_tokens": 64},
    "task": "generate",
    "system": "Be brief.",
    "sampling": {"temperature": 0.7, "max_tokens": 32},
    "select": "best_score",
    "adapters": {},
    "fan_out": "off",
    "strategy": "hybrid",
    "max_rounds": 4,
    "max_attempts": 3,
    "truncated": "reject",
    "truncated_max_tokens_factor": 2.0,
    "max_tokens_cap": 512,
    "retry_template": "{{ q }} again",
    "retry_system": None,
    "retry_sampling": {"2": {"temperature": 1.0}},
    "records_per_shard": 100,
    "lanes": 3,
    "chunk_size": 500,
    "id_field": "key",
    "assign_ids": True,
    "max_line_bytes": 16777216,
    "max_id_bytes": 512,
    "output_format": "parquet",
    "hybrid_min_shrink": 0.3,
    "job_retries": 2,
    "unreachable_grace_s": 120,
    "review": "on_low_approval",
    "review_min_approval": 0.5,
    "review_below_score": 0.4,
    "spot_check_approved": 5,
    "gate_idle": "release",
    "gate_keep_warm_s": 60.0,
    "max_failed_shards": 2,
    "preflight_records": 200,
    "budget_gpu_hours": 1.5,
    "judge_pool": None,
}
BASE = {"input": "/d.jsonl", "run_root": "/r", "prompt_template": "{{ q }}", "judge": {"type": "llm"}}


def test_a_run_json_written_flat_loads_into_its_sections_and_gives_back_the_same_settings() -> None:
    data = copy.deepcopy(OLD_RUN_SETTINGS)
    cfg = RunConfig.from_dict(dict(data))
    assert cfg.to_dict() == data
    assert (cfg.data.id_field, cfg.prompt.select, cfg.judging.judge["max_tokens"]) == (
        "key",
        "best_score",
        64,
    )
    assert (cfg.retries.strategy, cfg.reviews.spot_check_approved, cfg.sharding.lanes) == ("hybrid", 5, 3)
    assert cfg.budget.budget_gpu_hours == 1.5 and cfg.run_root == "/runs/r"
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    del data["output_format"]  # a run.json from before the setting: its outputs are JSONL
    assert RunConfig.from_dict(data).data.output_format == "jsonl"


def test_each_setting_is_in_one_section_and_the_map_comes_from_the_dataclasses() -> None:
    names = [f.name for f in dataclasses.fields(RunConfig)]
    assert names[0] == "run_root"
    flat = [f.name for name in names[1:] for f in dataclasses.fields(getattr(RunConfig.of(**BASE), name))]
    assert len(flat) == len(set(flat)) == len(RunConfig.setting_fields())
    assert set(RunConfig.of(**BASE).to_dict()) == {"run_root", *flat}


def test_unknown_flat_settings_are_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"unknown run settings \['lane'\]"):
        RunConfig.of(**BASE, lane=3)
    with pytest.raises(ConfigError, match=r"unknown run settings \['lane'\]"):
        RunConfig.of(**BASE).replace(lane=3)
    with pytest.raises(ConfigError, match="without run_root"):
        RunConfig.of(**{k: v for k, v in BASE.items() if k != "run_root"})


def test_replace_changes_flat_settings_in_their_sections_and_checks_them_anew() -> None:
    cfg = RunConfig.of(**BASE)
    other = cfg.replace(lanes=4, system="Be brief.", run_root="/other")
    assert (other.sharding.lanes, other.prompt.system, other.run_root) == (4, "Be brief.", "/other")
    assert other.data is cfg.data and cfg.sharding.lanes == 0  # untouched sections are shared
    assert cfg.setting("lanes") == 0 and other.setting("system") == "Be brief."
    with pytest.raises(ConfigError, match="review_below_score"):  # a check across sections
        cfg.replace(judge={"type": "regex", "pattern": "x"}, review_below_score=0.5)
    assert round_config(cfg, {"temperature": 0.3, "system": "S"}).prompt.sampling == {"temperature": 0.3}


def test_each_section_checks_its_own_fields() -> None:
    with pytest.raises(ConfigError, match="max_line_bytes must be >="):
        DataConfig(input="/d.jsonl", max_line_bytes=1)
    with pytest.raises(ConfigError, match="lanes must be >= 0"):
        ShardingConfig(lanes=-1)
    with pytest.raises(ConfigError, match="strategy 'often'"):
        RetryConfig(strategy="often")
    with pytest.raises(ConfigError, match="spot_check_approved must be an integer"):
        ReviewConfig(spot_check_approved=-1)
