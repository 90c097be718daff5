"""The run report's plans (``report/summary.json``): what each slot decided, without the settings its
round ran (templates, system prompt, judge), which stay in the slot's ``plan.json``."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.state.config import round_config
from airflow_batchinfer.state.docs import Plan, read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.shard_ref import ShardRef
from tests.support.fake_jobs import close, finish_shard, make_run, plan_round


def evens(shard: ShardRef) -> set[str]:
    return {r["id"] for r in JsonlFile(shard.uri).iter_records() if int(r["id"][1:]) % 2 == 0}


def test_the_reports_plans_leave_out_the_config_their_plan_json_keeps(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=2, sampling={"temperature": 0.7}, system="Be brief.")
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, evens(s))
    close(cfg, plan)
    plan = propose_slot(cfg, "round-01").plan  # a review changed the temperature for this round
    plan.settings = {"temperature": 1.3}
    plan.config = round_config(cfg, plan.settings)
    write_plan(layout, plan)
    for s in plan.shards:
        finish_shard(plan.config, 1, s, {"r01", "r03"})
    close(cfg, plan)  # close runs the settings the plan carries
    plan_round(cfg, "tail")

    report = build_report(cfg)
    stored = json.loads((Path(cfg.run_root) / "report" / "summary.json").read_text())
    fields = set(Plan.model_fields) - {"config"}
    for plans in (report["plans"], stored["plans"]):
        assert [p["slot"] for p in plans] == ["round-00", "round-01", "tail"]
        assert all(set(p) == fields for p in plans), plans  # "shards" is their count
        assert [p["shards"] for p in plans] == [3, 2, 2]
        assert plans[1]["settings"] == {"temperature": 1.3}
        assert "Be brief." not in json.dumps(plans) and "{{ question }}" not in json.dumps(plans)
    kept = read_plan(layout, "round-01")
    assert kept is not None and kept.config is not None
    assert (kept.config.prompt.sampling, kept.config.prompt.system) == ({"temperature": 1.3}, "Be brief.")
