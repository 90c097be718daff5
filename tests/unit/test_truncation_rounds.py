"""Truncated rows through rounds (issue 25, item 4): the worker's own job code (SIMULATED engine, a
prompt that asks for more tokens than the run's max_tokens) and the round's close."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import IDS
from tests.support.rounds import rows_in
from tests.support.truncating import LONG, run_round, truncating_run


def test_truncated_rows_are_rejected_and_round_1_retries_them_with_twice_the_tokens(tmp_path: Path) -> None:
    cfg = truncating_run(tmp_path)
    first = run_round(cfg, "round-00")
    layout = RunLayout(cfg.run_root)
    # the judge approves everything it sees: only the truncated rows are rejected, before it
    assert (first["approved"], first["rejected"], first["truncated"]) == (27, 3, 3)
    rejected = rows_in(layout.rejected_dir(0))
    assert sorted(r["id"] for r in rejected) == LONG
    for row in rejected:
        assert (row["finish_reason"], row["max_tokens"], row["attempts"]) == ("length", 16, 1)
        assert row["judgment"]["reason"].startswith("truncated: attempt 1 stopped at max_tokens 16")
    approved = rows_in(layout.results)
    assert {(r["finish_reason"], r["max_tokens"]) for r in approved} == {("stop", 16)}
    manifest = read_job_manifest(layout.job_manifest(0, "part-00000", "infer_judge"))
    assert manifest is not None and manifest.reason_groups == {"truncated": 2}  # r00, r05

    second = run_round(cfg, "round-01")
    assert (second["pending"], second["approved"], second["truncated"]) == (3, 3, 0)
    retried = [r for r in rows_in(layout.results) if r["round"] == 1]
    assert sorted(r["id"] for r in retried) == LONG
    assert {(r["max_tokens"], r["finish_reason"], r["attempts"]) for r in retried} == {(32, "stop", 2)}
    assert second["invariant"]["ok"] and Counter(r["id"] for r in rows_in(layout.results)) == Counter(IDS)
    # the report counts them per round
    report = build_report(cfg)
    assert [r["truncated"] for r in report["rounds"]] == [3, 0]
    table = render_markdown(report).split("| round | mode |")[1].splitlines()
    assert "| truncated |" in table[0] and table[2].startswith("| 0 | rounds | 30 | 27 | 3 | 3 |")


def test_at_the_cap_the_retry_runs_with_the_cap_and_the_reason_says_so(tmp_path: Path) -> None:
    cfg = truncating_run(tmp_path, max_tokens_cap=20)
    assert run_round(cfg, "round-00")["truncated"] == 3
    second = run_round(cfg, "round-01")
    assert (second["approved"], second["rejected"], second["truncated"]) == (0, 3, 3)
    rows = rows_in(RunLayout(cfg.run_root).rejected_dir(1))
    assert {r["max_tokens"] for r in rows} == {20}  # raised from 16 to the cap, not to 32
    assert all("at the deployment's cap (max_max_tokens 20)" in r["judgment"]["reason"] for r in rows)


def test_judge_mode_judges_truncated_rows_and_still_counts_them(tmp_path: Path) -> None:
    first = run_round(truncating_run(tmp_path, truncated="judge"), "round-00")
    assert (first["approved"], first["rejected"], first["truncated"]) == (30, 0, 3)


def test_truncated_rows_are_retried_not_put_before_people(tmp_path: Path) -> None:
    cfg = truncating_run(tmp_path, review_below_score=1.0)  # every judged verdict goes to people
    first = run_round(cfg, "round-00")
    assert (first["for_review"], first["truncated"]) == (27, 3)
    truncated = [r for r in rows_in(RunLayout(cfg.run_root).rejected_dir(0)) if r["id"] in LONG]
    assert len(truncated) == 3 and not any(r["judgment"].get("for_review") for r in truncated)
