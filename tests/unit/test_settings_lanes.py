"""The run setting ``lanes`` (issue 24, item 2), described once (``settings.py``): the DAG param's
schema, ``batchinfer run --lanes``, the settings table and ``RunConfig.sharding.lanes`` all come from it."""

from __future__ import annotations

import pytest

from airflow_batchinfer.cli import build_parser
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.spec.settings import param_schemas, reference_table, run_settings_from_args, setting
from airflow_batchinfer.state.config import RunConfig

BASE = {"input": "data.jsonl", "run_root": "/r", "prompt_template": None, "judge": {"type": "llm"}}


def test_lanes_default_to_one_per_pool_slot_everywhere() -> None:
    assert setting("lanes").default == 0 and RunConfig.of(**BASE).sharding.lanes == 0
    schema = param_schemas()["lanes"]  # a DAG param a trigger may set
    assert (schema["type"], schema["minimum"]) == ("integer", 0) and "one per pool slot" in schema[
        "description"
    ]
    _, rows = reference_table()
    [row] = [r for r in rows if "lanes" in r[0]]
    assert "0: one per pool slot (replicas × concurrency)" in " ".join(row)


def test_batchinfer_run_takes_lanes_and_refuses_a_negative_count(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["run", "data.jsonl", "/runs/r", "--lanes", "12"])
    assert run_settings_from_args(args)["lanes"] == 12
    assert RunConfig.of(run_root="/runs/r", **run_settings_from_args(args)).sharding.lanes == 12
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "data.jsonl", "/runs/r", "--lanes", "-1"])
    assert "-1 is less than 0" in capsys.readouterr().err


def test_a_run_config_with_negative_lanes_is_refused_with_what_zero_means() -> None:
    with pytest.raises(ConfigError, match=r"lanes must be >= 0 \(0: one lane per pool slot\), got -2"):
        RunConfig.of(**BASE, lanes=-2)


def test_a_run_json_written_before_lanes_still_loads() -> None:
    old = RunConfig.of(**BASE).to_dict()
    del old["lanes"]
    assert RunConfig.from_dict(old).sharding.lanes == 0
