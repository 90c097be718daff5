"""The truncation settings (issue 25, item 4) in the one description of the settings, the run's job
params, job ids and fingerprints, and the cap a DAG run takes from the deployment's max_max_tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.cli import build_parser
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.rpc.fingerprint import fingerprint
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.spec.settings import param_schemas, reference_table, run_settings_from_args, setting
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.shards import PlannedShard

KEYS = ("truncated", "truncated_max_tokens_factor", "max_tokens_cap")
SHARD = PlannedShard.of({"shard_id": "part-00000", "uri": "/data/in/part-00000.jsonl.zst", "records": 10})
INFO = {"size": 100, "mtime": 1.0}
ENGINE = {"engine": "simulated"}


def config(**settings: Any) -> RunConfig:
    return RunConfig.of(input="/data/in.jsonl", run_root="/runs/r", prompt_template="{{ q }}",
                        judge={"type": "llm"}, **settings)  # fmt: skip


def test_the_settings_are_described_once_for_params_cli_and_docs() -> None:
    assert (setting("truncated").default, setting("truncated").choices) == ("reject", ("reject", "judge"))
    assert setting("truncated_max_tokens_factor").default == 2.0
    schemas = param_schemas()
    assert schemas["truncated"]["enum"] == ["reject", "judge"]
    assert schemas["truncated_max_tokens_factor"]["minimum"] == 1
    assert "max_tokens_cap" not in schemas  # a DAG run's is the deployment's, never a trigger's
    flags = ["--truncated", "judge", "--truncated-max-tokens-factor", "3", "--max-tokens-cap", "512"]
    got = run_settings_from_args(build_parser().parse_args(["run", "d.jsonl", "/runs/r", *flags]))
    assert [got[k] for k in KEYS] == ["judge", 3.0, 512]
    names = {row[0] for row in reference_table()[1]}
    assert {f"``{k}``" for k in KEYS} <= names


def test_a_bad_setting_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="truncated 'drop': choose one of reject, judge"):
        config(truncated="drop")
    with pytest.raises(ConfigError, match="truncated_max_tokens_factor must be a number in"):
        config(truncated_max_tokens_factor=0.5)


def test_at_the_defaults_job_ids_and_fingerprints_are_what_they_were() -> None:
    """A finished job of a run started before these settings is not made stale by them."""
    for kind in ("infer", "infer_judge", "in_place"):
        spec = job_spec(config(), kind, 0, SHARD)
        assert not set(KEYS) & set(spec.params), kind
    base = job_spec(config(), "infer_judge", 0, SHARD)
    for changed in ({"truncated": "judge"}, {"truncated_max_tokens_factor": 3.0}, {"max_tokens_cap": 64}):
        other = job_spec(config(**changed), "infer_judge", 0, SHARD)
        assert other.params.items() >= changed.items()
        assert other.job_id != base.job_id
        assert fingerprint(other, ENGINE, INFO) != fingerprint(base, ENGINE, INFO)
    judge = job_spec(config(truncated="judge", judge_pool="local://j"), "judge", 0, SHARD)
    assert judge.params["truncated"] == "judge"  # a judge with its own pool decides the same way


def test_a_dag_run_takes_the_deployments_max_max_tokens_as_its_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.operators.shard import ShardDatasetOperator
    from tests.support.airflow_ti import FakeTI

    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"id": {i}, "q": "x"}}\n' for i in range(4)))
    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_MAX_TOKENS", "300")
    for given, pinned in ((None, 300), (100, 100)):  # a lower cap of the run's own stays
        run_root = tmp_path / f"run-{given}"
        cfg = {"input": str(data), "run_root": str(run_root), "prompt_template": "{{ q }}",
               "judge": {"type": "llm"}, "max_tokens_cap": given}  # fmt: skip
        ShardDatasetOperator(task_id="shard", config=cfg).execute({"params": {}, "ti": FakeTI()})  # type: ignore[arg-type]
        assert json.loads((run_root / "run.json").read_text())["max_tokens_cap"] == pinned
