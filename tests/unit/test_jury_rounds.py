"""Juries through a round on the worker's own job code (SIMULATED engine: its llm verdicts approve by
a hash of the record): each member's verdict in ``judgment.members``, the round's summary and report
counting how often members disagree, the id invariant; an infer job carrying its llm members'
verdicts for a judge pool that scores; a jury in place; and one beside a classifier (a scoring model
at the engine seam) with review_below_score and spot checks. Real engines:
tests/component/test_model_judges.py."""

from __future__ import annotations

from pathlib import Path

from airflow_batchinfer.judges.spot_check import score_bucket
from airflow_batchinfer.run.jobs import judge_input
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile
from tests.support.fake_jobs import close, make_run, plan_round
from tests.support.rounds import rows_in
from tests.support.worker_jobs import HashScoringEngine, run_jobs

SHORT = {"type": "length", "max_chars": 20, "name": "short"}


def test_a_jury_round_keeps_each_members_verdict_and_counts_their_disagreement(tmp_path: Path) -> None:
    jury = {"type": "jury", "judges": [{"type": "llm"}, SHORT, {"type": "length", "min_chars": 1}]}
    cfg = make_run(tmp_path, judge=jury)
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer_judge", 0, s) for s in plan.shards], approval_rate=0.5, completion_tokens=4)
    summary = close(cfg, plan)
    layout = RunLayout(cfg.run_root)
    approved, rejected = rows_in(layout.results), rows_in(layout.rejected_dir(0))
    assert summary["invariant"]["ok"] and len(approved) + len(rejected) == 30
    split = 0
    for row in approved + rejected:
        members = row["judgment"]["members"]
        assert [m["name"] for m in members] == ["llm", "short", "length"]
        votes = [m["approved"] for m in members]
        assert row["judgment"]["approved"] is (sum(votes) >= 2) is (row["status"] == "approved")
        assert row["judgment"]["score"] == round(sum(votes) / 3, 4)
        assert "jury_verdicts" not in row  # nothing carried: every member judged in the job
        split += len(set(votes)) > 1
    jury_stats = summary["jury"]
    assert jury_stats["voted"] == 30 and jury_stats["split"] == split
    assert jury_stats["disagreement_rate"] == round(split / 30, 4)
    llm = jury_stats["members"]["llm"]
    assert llm["approved"] == sum(r["judgment"]["members"][0]["approved"] for r in approved + rejected)
    assert 0 < llm["approved"] < 30  # the simulated judge approves about half
    report = render_markdown(build_report(cfg))
    assert (
        "## Jury" in report
        and f"| 0 | 30 | {split} ({split / 30:.1%}) | llm {llm['approval_rate']:.1%}" in report
    )


def test_an_infer_job_carries_its_llm_members_verdicts_to_a_scoring_judge_pool(tmp_path: Path) -> None:
    jury = {
        "type": "jury",
        "judges": [{"type": "llm", "name": "critic"}, {"type": "classifier"}],
        "vote": "all",
    }
    cfg = make_run(tmp_path, judge=jury, judge_pool="local://judges")
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer", 0, s) for s in plan.shards], approval_rate=0.5)
    rows = [r for s in plan.shards for r in JsonlFile(judge_input(cfg, 0, s).uri).iter_records()]
    assert len(rows) == 30
    verdicts = [r["jury_verdicts"]["critic"] for r in rows]
    assert set(rows[0]["jury_verdicts"]) == {"critic"}  # the classifier is judged on the judge pool
    assert {v["approved"] for v in verdicts} == {True, False}  # the simulated judge's verdicts, carried


def test_with_candidates_each_carries_its_own_verdicts(tmp_path: Path) -> None:
    jury = {"type": "jury", "judges": [{"type": "llm", "name": "critic"}, {"type": "classifier"}]}
    cfg = make_run(tmp_path, judge=jury, judge_pool="local://judges", sampling={"n": 3, "temperature": 0.7})
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer", 0, s) for s in plan.shards[:1]], approval_rate=0.5)
    rows = list(JsonlFile(judge_input(cfg, 0, plan.shards[0]).uri).iter_records())
    assert rows and all("jury_verdicts" not in r and len(r["candidates"]) == 3 for r in rows)
    verdicts = [c["jury_verdicts"]["critic"]["approved"] for r in rows for c in r["candidates"]]
    assert len(verdicts) == 3 * len(rows) and set(verdicts) == {True, False}  # judged one by one


def test_a_jury_judges_each_attempt_in_place(tmp_path: Path) -> None:
    """Strategy in_place (a jury of llm and rule judges: no model judge, which needs rounds): each
    attempt is voted on, the kept row carries its last attempt's members, and the summary's jury
    counts every attempt's vote."""
    jury = {"type": "jury", "judges": [{"type": "llm"}, SHORT, {"type": "length", "min_chars": 1}]}
    cfg = make_run(tmp_path, judge=jury, strategy="in_place", max_attempts=3)
    plan = plan_round(cfg, "tail")
    assert plan.mode == "in_place"
    run_jobs(cfg, [("in_place", plan.round, s) for s in plan.shards], approval_rate=0.5, completion_tokens=4)
    summary = close(cfg, plan)
    layout = RunLayout(cfg.run_root)
    rows = rows_in(layout.results) + rows_in(layout.rejected_dir(plan.round))
    assert summary["invariant"]["ok"] and len(rows) == 30
    for row in rows:
        votes = [m["approved"] for m in row["judgment"]["members"]]
        assert row["judgment"]["approved"] is (sum(votes) >= 2) is (row["status"] == "approved")
    assert summary["jury"]["voted"] == summary["attempts"] > 30  # some rows took several attempts


def test_a_spot_checked_jury_of_the_runs_model_and_a_classifier(tmp_path: Path) -> None:
    """The three together: a jury (mean_score) of an llm member, judged as the answers are generated,
    and a classifier on the judge pool (a scoring model at the engine seam), with review_below_score
    and spot checks of every approval. The jury's score, the mean of its members', is what holds a
    verdict for people and what the strata bucket by tenth."""
    jury = {
        "type": "jury",
        "vote": "mean_score",
        "judges": [{"type": "llm", "name": "critic"}, {"type": "classifier"}],
    }
    cfg = make_run(
        tmp_path, judge=jury, judge_pool="local://judges", review_below_score=0.7, spot_check_approved=30
    )
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer", 0, s) for s in plan.shards], approval_rate=0.5, completion_tokens=4)
    run_jobs(cfg, [("judge", 0, s) for s in plan.shards], serving=HashScoringEngine(("rejected", "approved")))
    summary = close(cfg, plan)
    layout = RunLayout(cfg.run_root)
    rows = rows_in(layout.results) + rows_in(layout.rejected_dir(0))
    # every verdict goes to people: scored below 0.7, or an approval spot-checked (rate 1)
    assert summary["invariant"]["ok"] and len(rows) == 30 and not rows_in(layout.results)
    strata: dict[str, dict[str, int]] = {}
    for row in rows:
        j = row["judgment"]
        critic, classifier = j["members"]
        assert (critic["name"], classifier["name"]) == ("critic", "classifier") and "jury_verdicts" not in row
        assert j["score"] == round((critic["score"] + classifier["score"]) / 2, 6)
        assert j["for_review"] and j["judge_approved"] is (j["score"] >= 0.5)
        assert j.get("spot_check", False) is (j["score"] >= 0.7)
        stratum = "rejected" if j["score"] < 0.5 else ("held" if j["score"] < 0.7 else "approved")
        strata.setdefault(stratum, {}).setdefault(score_bucket(j["score"]), 0)
        strata[stratum][score_bucket(j["score"])] += 1
    assert summary["verdicts"] == strata and set(strata) == {"approved", "held", "rejected"}
    assert summary["spot_checks"] == sum(strata["approved"].values()) and summary["jury"]["voted"] == 30
