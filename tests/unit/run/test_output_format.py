"""A run keeps the output format it started with: going on in another would run every job again and
double the rows already in results/ (``prepare_run`` checks it first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.prepare import check_output_format
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from tests.support.rounds import fake_round, make_run


def test_a_run_refuses_another_output_format_than_its_outputs(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, output_format="parquet")
    fake_round(cfg, "round-00", {f"r{i:02d}" for i in range(12)})
    results = sorted(p.name for p in Path(RunLayout(cfg.run_root).results).iterdir())
    assert results == [f"round00-part-0000{i}.parquet" for i in range(3)]
    check_output_format(RunLayout.of(cfg.run_root, "parquet"), "parquet", None)  # the same: goes on
    with pytest.raises(ConfigError, match=r"round00-part-00000\.parquet: this run's outputs are not jsonl"):
        check_output_format(RunLayout.of(cfg.run_root, "jsonl"), "jsonl", None)


def test_an_unknown_output_format_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="output_format 'csv': choose one of jsonl, parquet"):
        RunConfig.of(input="x.jsonl", run_root="/tmp/r", output_format="csv")
