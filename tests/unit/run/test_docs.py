"""A plan carries the settings its round runs: computed once by the plan step, written into
``plan.json`` (``config``) and read back as they were; a plan written before it carried them reads
with them computed as its round's tasks did then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.state.config import RunConfig, round_config
from airflow_batchinfer.state.docs import Plan, read_plan, write_plan, write_run_config
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import make_run, plan_round


def stored(cfg: RunConfig, slot: str) -> dict[str, object]:
    return json.loads((Path(cfg.run_root) / slot / "plan.json").read_text())  # type: ignore[no-any-return]


def test_a_plan_stores_its_rounds_settings_and_reads_them_back(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    assert plan.config == cfg and stored(cfg, "round-00")["config"] == cfg.to_dict()
    back = read_plan(RunLayout(cfg.run_root), "round-00")
    assert back is not None and back.config == cfg and back == plan
    # an unchanged round's jobs are the same jobs (a resume finds their outputs)
    shard = plan.shards[0]
    before, after = job_spec(cfg, "infer_judge", 0, shard), job_spec(back.config, "infer_judge", 0, shard)
    assert (before.job_id, before.params) == (after.job_id, after.params)


def test_a_changed_rounds_settings_are_stored_whole(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, sampling={"temperature": 0.7})
    plan = plan_round(cfg)
    plan.settings = {"temperature": 1.3, "prompt_template": "Q: {{ question }}"}
    plan.config = round_config(cfg, plan.settings)
    write_plan(RunLayout(cfg.run_root), plan)
    data = stored(cfg, "round-00")["config"]
    assert isinstance(data, dict) and data["sampling"] == {"temperature": 1.3}
    assert data["prompt_template"] == "Q: {{ question }}" and data["judge"] == cfg.judging.judge
    back = read_plan(RunLayout(cfg.run_root), "round-00")
    assert back is not None and back.effective_config(cfg) == plan.config != cfg


def test_a_plan_of_an_earlier_pre_release_is_refused_with_a_remedy(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    write_run_config(cfg)
    plan_round(cfg)
    path = Path(cfg.run_root) / "round-00" / "plan.json"
    old = {k: v for k, v in stored(cfg, "round-00").items() if k != "config"}
    path.write_text(json.dumps({**old, "schema_version": 1}))  # 0.1.0's pre-releases: no config
    with pytest.raises(StorageError, match=r"schema_version 1 is not supported.*delete the plan"):
        read_plan(RunLayout(cfg.run_root), "round-00")


def test_a_plan_with_an_unknown_field_is_refused_by_name(tmp_path: Path) -> None:
    layout = RunLayout(str(tmp_path))
    write_plan(layout, Plan(slot="round-00", round=0, mode="rounds"))
    uri = tmp_path / "round-00" / "plan.json"
    doc = json.loads(uri.read_text())
    uri.write_text(json.dumps({**doc, "lanes": 4}))
    with pytest.raises(
        StorageError, match=r"plan\.json: not a round plan .*lanes: Extra inputs.*delete the plan"
    ):
        read_plan(layout, "round-00")
