"""People as the judge (``{"type": "human"}``) or beside it (``review_below_score``): the worker's
own job code in process, then the round's close, the next plan's gate and the decisions."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.review.decisions import Decision, DecisionLog
from airflow_batchinfer.run.plan import CONTINUE, apply_choice, propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir
from tests.support.fake_jobs import close, plan_round
from tests.support.review_runs import finished_report, make_run
from tests.support.worker_jobs import run_jobs


def test_a_human_judge_sends_every_sample_to_people_and_the_gate_always_opens(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, judge={"type": "human"}, review="never")
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer_judge", 0, s) for s in plan.shards], fail_marker="FAIL")
    summary = close(cfg, plan)
    # every sample awaits a verdict, but for the inference errors (the model failed: retried)
    assert summary["approved"] == 0 and summary["for_review"] == 32 and summary["rejected"] == 40
    rows = {r["id"]: r for f in JsonlDir(layout.rejected_dir(0)).jsonl_files() for r in f.iter_records()}
    assert rows["q1"]["judgment"] == {
        "approved": False,
        "reason": "awaiting a person's verdict",
        "for_review": True,
    }
    proposal = propose_slot(cfg, "round-01")
    assert proposal.options  # review "never", yet people judge: the gate opens
    DecisionLog(cfg.run_root, 0).append(Decision.make(0, "accept", "alice", ids=["q1", "q2", "q3"]))
    DecisionLog(cfg.run_root, 0).append(Decision.make(0, "drop", "bob", ids=["q4"], note="off topic"))
    plan1 = apply_choice(cfg, proposal, CONTINUE, by="review (alice)")
    assert plan1.reviewed is not None and plan1.reviewed.counts == {"accept": 3, "retry": 36, "drop": 1}
    write_plan(layout, plan1)
    accepted = [r for f in JsonlDir(layout.results).jsonl_files() for r in f.iter_records()]
    assert sorted(r["id"] for r in accepted) == ["q1", "q2", "q3"]
    assert {r["judgment"]["person"]["by"] for r in accepted} == {"alice"}  # the verdict records who gave it


def test_review_below_score_routes_low_scored_verdicts_to_people(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, judge={"type": "llm"}, review_below_score=0.5)
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer_judge", 0, s) for s in plan.shards], fail_marker="FAIL")
    summary = close(cfg, plan)
    rows = [
        r for f in JsonlDir(RunLayout(cfg.run_root).rejected_dir(0)).jsonl_files() for r in f.iter_records()
    ]
    low = [r for r in rows if r["judgment"].get("for_review")]
    assert summary["for_review"] == len(low) > 0
    assert all(
        r["judgment"]["score"] < 0.5 and r["judgment"]["reason"].startswith("for review: ") for r in low
    )
    assert {r["judgment"]["judge_approved"] for r in low} == {True, False}  # approvals too wait for people
    approved = [r for f in JsonlDir(RunLayout(cfg.run_root).results).jsonl_files() for r in f.iter_records()]
    assert approved and all(r["judgment"]["score"] >= 0.5 for r in approved)  # confident ones passed
    assert propose_slot(cfg, "round-01").options  # they wait: the gate opens
    write_plan(RunLayout(cfg.run_root), apply_choice(cfg, propose_slot(cfg, "round-01"), "Stop"))
    assert finished_report(cfg)["invariant"]["ok"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"judge": {"type": "human"}, "strategy": "in_place"}, "strategy rounds"),
        ({"judge": {"type": "length", "min_chars": 1}, "review_below_score": 0.5}, "gives no scores"),
        ({"judge": {"type": "human", "x": 1}}, None),
    ],
)
def test_people_judging_refuses_what_cannot_work(settings: dict, message: str | None) -> None:
    base = {"input": "x.jsonl", "run_root": "/tmp/r", "prompt_template": "{{ q }}"}
    with pytest.raises(ConfigError, match=message or "takes no fields"):
        RunConfig.of(**{**base, **settings}).validate()
