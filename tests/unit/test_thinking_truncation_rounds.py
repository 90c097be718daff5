"""Rows cut while thinking through rounds (issue 39, item 1): the worker's own job code and the round's
close, the engine seam standing in for a reasoning model (the SIMULATED engine's rows cut at
max_tokens are marked ``truncated_in_thinking``, as a reasoning engine marks an answer cut inside its
reasoning)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.worker.jobs import in_place, infer
from tests.support.fake_jobs import close, make_run, plan_round
from tests.support.rounds import rows_in
from tests.support.truncating import LONG, TEMPLATE, run_round, truncating_run
from tests.support.worker_jobs import run_jobs


@pytest.fixture
def thinking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each answer cut at max_tokens was cut inside the model's reasoning (a row as the reasoning
    engines write it: ``reasoning``, ``truncated_in_thinking``, an empty answer)."""
    real = infer.generated

    def cut_in_thinking(res: Any, request: Any) -> dict[str, Any]:
        fields = real(res, request)
        for answer in [fields, *fields.get("candidates", ())]:
            if answer["finish_reason"] == "length":
                answer.update(result="", reasoning=answer["result"], truncated_in_thinking=True)
        return fields

    monkeypatch.setattr(infer, "generated", cut_in_thinking)
    monkeypatch.setattr(in_place, "generated", cut_in_thinking)


@pytest.mark.usefixtures("thinking")
def test_rows_cut_in_thinking_are_their_own_group_counted_apart_and_retried_with_more(tmp_path: Any) -> None:
    cfg = truncating_run(tmp_path)
    first = run_round(cfg, "round-00")
    layout = RunLayout(cfg.run_root)
    # rejected before the judge (which approves all it sees), counted among the truncated and apart
    assert (first["approved"], first["rejected"], first["truncated"], first["truncated_in_thinking"]) == (
        27,
        3,
        3,
        3,
    )
    rejected = rows_in(layout.rejected_dir(0))
    assert sorted(r["id"] for r in rejected) == LONG
    for row in rejected:
        assert row["judgment"]["reason"] == (
            "truncated_in_thinking: attempt 1 spent its whole budget thinking (max_tokens 16; "
            "finish_reason length, reasoning not ended): no answer; a retry runs with max_tokens 32"
        )
    manifest = read_job_manifest(layout.job_manifest(0, "part-00000", "infer_judge"))
    assert manifest is not None and manifest.reason_groups == {"truncated_in_thinking": 2}  # r00, r05
    assert manifest.counts.truncated_in_thinking == 2

    second = run_round(cfg, "round-01")
    assert (second["approved"], second["truncated"]) == (3, 0) and "truncated_in_thinking" not in second
    retried = [r for r in rows_in(layout.results) if r["round"] == 1]
    assert {(r["max_tokens"], r["finish_reason"]) for r in retried} == {(32, "stop")}
    assert not any("reasoning" in r or "truncated_in_thinking" in r for r in retried)  # not the old ones
    report = build_report(cfg)
    assert [r.get("truncated_in_thinking") for r in report["rounds"]] == [3, None]
    table = render_markdown(report).split("| round | mode |")[1].splitlines()
    assert table[2].startswith("| 0 | rounds | 30 | 27 | 3 | 3 (3 in thinking) |")


@pytest.mark.usefixtures("thinking")
def test_in_place_attempts_cut_in_thinking_are_counted_apart(tmp_path: Any) -> None:
    cfg = truncating_run(tmp_path, strategy="in_place", max_attempts=2)
    plan = plan_round(cfg, "tail")
    run_jobs(cfg, [("in_place", plan.round, s) for s in plan.shards], approval_rate=1.0)
    summary = close(cfg, plan)
    # each retry ran with 32 tokens and was approved: one attempt cut in thinking per long record
    assert (summary["approved"], summary["truncated"], summary["truncated_in_thinking"]) == (30, 3, 3)
    assert summary["attempts"] == 33


@pytest.mark.usefixtures("thinking")
def test_a_row_of_candidates_all_cut_in_thinking_keeps_the_chosen_ones_reasoning(tmp_path: Any) -> None:
    cfg = make_run(tmp_path, sampling={"n": 2, "max_tokens": 16, "temperature": 0.7})
    first = run_round(cfg.replace(prompt_template=TEMPLATE), "round-00")
    assert (first["truncated"], first["truncated_in_thinking"]) == (3, 3)
    rejected = {r["id"]: r for r in rows_in(RunLayout(cfg.run_root).rejected_dir(0))}
    for rid in LONG:
        row = rejected[rid]
        assert row["truncated_in_thinking"] is True and row["reasoning"] == row["candidates"][0]["reasoning"]
        assert row["judgment"]["reason"].startswith("truncated_in_thinking: attempt 1 spent its whole budget")
        assert all(c["judgment"]["reason"].startswith("truncated_in_thinking:") for c in row["candidates"])
