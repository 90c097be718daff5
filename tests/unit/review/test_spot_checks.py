"""Spot checks of the judge's approvals (``spot_check_approved``): the worker's own judge job in
process holds back a seeded sample of approved rows; the round's close counts them and the judged
rows per stratum; the gate opens; the decisions take effect (an undecided spot check follows the
judge into results, a person's verdict is recorded in the row's judgment, every id accounted for);
the calibration is stored, matches what the run's construction implies, and reaches the report and
the next gate. The judge is ``airflow_batchinfer.dev.calibration:judge``: wrong on a known, seeded share of
the rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev import calibration as c
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.spot_check import BUCKETS, round_rate, score_bucket, selected
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision, DecisionLog, tally
from airflow_batchinfer.run.gate.body import review_body
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.pipeline import run_pipeline
from airflow_batchinfer.run.plan import CONTINUE, STOP, Proposal, apply_choice, propose_slot
from airflow_batchinfer.run.prepare import run_key
from airflow_batchinfer.spec.settings import param_defaults, setting
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import DOC_VERSION, read_summary, write_run_config
from airflow_batchinfer.state.docs.calibration import read_calibration
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.storage import JsonlDir
from tests.support.fake_jobs import close, make_run, plan_round
from tests.support.review_runs import finished_report, rows_in
from tests.support.spot_checks import run_slot, spot_run
from tests.support.worker_jobs import HashScoringEngine, run_jobs


def decide_truthfully(cfg: RunConfig, r: int, share: float = 1.0) -> dict[str, int]:
    """What the scripted reviewer does on the desk, straight into the decision log: each sample of
    round ``r`` decided by its id as the truth says (a seeded ``share`` of those not spot checks)."""
    ids: dict[str, list[str]] = {"accept": [], "retry": []}
    for sample, _ in RoundView(cfg.run_root, r).scan(prompts=False):
        if not sample.spot_check and c._u("look", sample.id, sample.attempts) >= share:
            continue
        ids["accept" if c.truth(sample.id, sample.attempts) else "retry"].append(sample.id)
    log = DecisionLog(cfg.run_root, r)
    for action, chosen in ids.items():
        log.append(Decision.make(r, action, "alice", ids=chosen))  # type: ignore[arg-type]
    return {k: len(v) for k, v in ids.items()}


# ---------------------------------------------------------------------------------- the judge job
def test_the_judge_job_holds_back_a_seeded_sample_of_its_approvals(tmp_path: Path) -> None:
    cfg = spot_run(tmp_path, spot_check_approved=40)
    layout = RunLayout(cfg.run_root)
    plan = run_slot(cfg, "round-00")
    rate = round_rate(40, 400)
    assert rate == 0.1 and {s.spot_check_rate for s in plan.shards} == {rate}
    spec = job_spec(cfg, "infer_judge", 0, plan.shards[0])
    assert spec.params["spot_check"] == {"rate": rate, "seed": run_key(cfg.run_root)}
    assert "spot_check" not in cfg.judge_params().wire()  # the pre-flight's judge holds nothing back

    approved_by_judge = {f"c{i:05d}" for i in range(400) if c.verdict(f"c{i:05d}", 1)}
    picked = {i for i in approved_by_judge if selected(i, rate=rate, seed=run_key(cfg.run_root))}
    summary = read_summary(layout, 0)
    assert summary is not None and summary.spot_checks == len(picked) > 0
    assert summary.for_review == len(picked) and summary.approved == len(approved_by_judge) - len(picked)
    rejected = rows_in(layout.rejected_dir(0))
    held = {i for i, r in rejected.items() if r["judgment"].get("spot_check")}
    assert held == picked
    one = rejected[min(held)]
    assert one["status"] == "rejected" and one["judgment"] == {
        "approved": False,
        "judge_approved": True,
        "reason": "spot check: looks right",
        "score": c.score(one["id"], 1),
        "for_review": True,
        "spot_check": True,
    }
    assert set(rows_in(layout.results)) == approved_by_judge - picked
    # the judged rows per stratum and score bucket: the calibration's weights
    assert summary.verdicts is not None
    assert sum(summary.verdicts["approved"].values()) == len(approved_by_judge)
    assert sum(summary.verdicts["rejected"].values()) == 400 - len(approved_by_judge)
    assert summary.invariant.ok
    # the gate opens (review is "never"), and names the spot checks
    proposal = propose_slot(cfg, "round-01")
    assert proposal.options
    body = review_body(cfg, proposal)
    assert f"{len(picked)} rows the judge approved are held for a spot check" in body


def test_without_spot_checks_nothing_changes_in_the_jobs(tmp_path: Path) -> None:
    cfg = spot_run(tmp_path)
    plan = run_slot(cfg, "round-00")
    assert all(s.spot_check_rate is None for s in plan.shards)
    spec = job_spec(cfg, "infer_judge", 0, plan.shards[0])
    assert "spot_check" not in spec.params
    summary = read_summary(RunLayout(cfg.run_root), 0)
    assert summary is not None and summary.spot_checks is None and summary.verdicts is None
    assert "spot_checks" not in summary.to_json() and "verdicts" not in summary.to_json()
    assert not propose_slot(cfg, "round-01").options  # no gate: review never, nobody checks the judge


def test_refusals() -> None:
    base = {"input": "x.jsonl", "run_root": "/tmp/r", "prompt_template": "{{ q }}", "judge": c.JUDGE}
    with pytest.raises(ConfigError, match="human judge approves none"):
        RunConfig.of(**{**base, "judge": {"type": "human"}, "spot_check_approved": 5})
    with pytest.raises(ConfigError, match="has no rounds"):
        RunConfig.of(**{**base, "strategy": "in_place", "spot_check_approved": 5})
    with pytest.raises(ConfigError, match="integer >= 0"):
        RunConfig.of(**{**base, "spot_check_approved": -1})
    assert RunConfig.of(**{**base, "strategy": "hybrid", "spot_check_approved": 5}).human_review
    with pytest.raises(ConfigError, match="need Airflow"):  # batchinfer run has no gate
        import asyncio

        asyncio.run(run_pipeline(RunConfig.of(**{**base, "spot_check_approved": 5}), None))  # type: ignore[arg-type]
    params = {"judge": {"type": "human"}, "spot_check": {"rate": 0.5, "seed": "s"}}
    with pytest.raises(ConfigError, match="human judge"):
        parse_params("judge", params)
    with pytest.raises(ConfigError, match="in_place job"):
        parse_params("in_place", {**params, "judge": c.JUDGE, "prompt_template": "{{ q }}"})
    # the one description of the setting: a DAG param, no batchinfer run flag (it has no gate)
    assert setting("spot_check_approved").flag is None and param_defaults()["spot_check_approved"] == 0


# ------------------------------------------------------------------------------- the decisions
def test_an_undecided_spot_check_follows_the_judge_whatever_the_answer(tmp_path: Path) -> None:
    """Nobody decides: Stop still puts the spot checks into results (approved, as the judge said)
    and leaves the judge's rejections pending; every id is accounted for, from digests."""
    cfg = spot_run(tmp_path, spot_check_approved=40)
    layout = RunLayout(cfg.run_root)
    run_slot(cfg, "round-00")
    summary = read_summary(layout, 0)
    assert summary is not None and summary.spot_checks
    assert tally([], RoundView(cfg.run_root, 0)) == {
        "accept": 0,
        "retry": summary.rejected - summary.spot_checks,
        "drop": 0,
        "approve": summary.spot_checks,
    }
    plan = run_slot(cfg, "round-01", STOP)
    assert plan.stop and plan.reviewed is not None
    assert plan.reviewed.counts["approve"] == summary.spot_checks and plan.reviewed.decisions == 0
    results = rows_in(layout.results)
    held = {i for i, r in results.items() if r["judgment"].get("spot_check")}
    assert len(held) == summary.spot_checks
    assert all(results[i]["status"] == "approved" and results[i]["judgment"]["approved"] for i in held)
    assert all("person" not in results[i]["judgment"] for i in held)
    report = finished_report(cfg)
    assert report["invariant"]["ok"] and report["invariant"]["checked"] == "digests"
    assert report["approved"] == summary.approved + summary.spot_checks == len(results)
    assert report["accepted_by_review"] == 0
    assert report["remaining_pending"] == summary.rejected - summary.spot_checks
    assert (
        "approved as the judge said: " + str(summary.spot_checks)
        in Path(layout.report, "report.md").read_text()
    )


def test_a_persons_verdict_is_recorded_in_the_rows_judgment(tmp_path: Path) -> None:
    cfg = spot_run(tmp_path, spot_check_approved=40)
    layout = RunLayout(cfg.run_root)
    run_slot(cfg, "round-00")
    rejected = rows_in(layout.rejected_dir(0))
    spots = sorted(i for i, r in rejected.items() if r["judgment"].get("spot_check"))
    plain = sorted(i for i, r in rejected.items() if not r["judgment"].get("spot_check"))
    log = DecisionLog(cfg.run_root, 0)
    log.append(Decision.make(0, "drop", "alice", ids=[spots[0]], note="wrong, the judge missed it"))
    log.append(Decision.make(0, "retry", "bob", ids=[spots[1]]))
    log.append(Decision.make(0, "accept", "carol", ids=[spots[2], plain[0]], note="fine"))
    log.append(Decision.make(0, "drop", "carol", ids=[plain[1]]))
    plan = run_slot(cfg, "round-01", CONTINUE)
    assert plan.reviewed is not None and plan.reviewed.counts["approve"] == len(spots) - 3

    dropped = rows_in(layout.dropped)
    person = dropped[spots[0]]["judgment"]["person"]
    assert person == {
        "approved": False,
        "action": "drop",
        "by": "alice",
        "at": person["at"],
        "note": "wrong, the judge missed it",
    }
    assert dropped[spots[0]]["judgment"]["overridden"] is True  # the judge approved it
    assert dropped[plain[1]]["judgment"]["overridden"] is False  # the judge rejected it too
    results = rows_in(layout.results)
    assert results[plain[0]]["accepted_by_review"] and results[plain[0]]["judgment"]["overridden"] is True
    assert results[plain[0]]["judgment"]["person"]["by"] == "carol"
    assert results[spots[2]]["judgment"]["overridden"] is False
    retried = rows_in(layout.reviewed(1))
    assert retried[spots[1]]["judgment"]["person"]["action"] == "retry"
    assert retried[spots[1]]["judgment"]["overridden"] is True
    # the calibration counts the four rows decided one by one
    doc = read_calibration(layout, 0)
    assert doc is not None and (doc.decisions, doc.reviewed, doc.spot_checks, doc.bulk) == (4, 5, 3, 0)


def test_bulk_decisions_are_applied_but_not_counted_as_verdicts(tmp_path: Path) -> None:
    cfg = spot_run(tmp_path, spot_check_approved=40)
    layout = RunLayout(cfg.run_root)
    run_slot(cfg, "round-00")
    summary = read_summary(layout, 0)
    assert summary is not None and summary.spot_checks
    DecisionLog(cfg.run_root, 0).append(Decision.make(0, "accept", "alice", filter={"group": "spot check"}))
    view = RoundView(cfg.run_root, 0)
    assert tally(DecisionLog(cfg.run_root, 0).read(), view)["accept"] == summary.spot_checks
    plan = run_slot(cfg, "round-01", CONTINUE)
    assert plan.reviewed is not None and plan.reviewed.counts["accept"] == summary.spot_checks
    doc = read_calibration(layout, 0)
    assert doc is not None and (doc.reviewed, doc.bulk) == (0, summary.spot_checks)
    assert doc.agreement is None and doc.notes
    assert all(
        r["judgment"]["person"]["bulk"] for r in rows_in(layout.results).values() if "person" in r["judgment"]
    )


# ---------------------------------------------------------------------- what the construction implies
def test_every_row_reviewed_the_calibration_is_the_constructions_exactly(tmp_path: Path) -> None:
    """With spot_check_approved above the round's size every approval is held, and the reviewer
    decides every row: the figures are those of the round's 400 judged rows counted from the
    construction, to the 4 digits stored; round 1 (the retried rows' second attempts) as well."""
    cfg = spot_run(tmp_path, spot_check_approved=10_000, per_shard=64)
    layout = RunLayout(cfg.run_root)
    run_slot(cfg, "round-00")
    decided = decide_truthfully(cfg, 0)
    plan1 = run_slot(cfg, "round-01", CONTINUE)
    doc = read_calibration(layout, 0)
    want = c.expected((f"c{i:05d}", 1) for i in range(400))
    assert doc is not None and doc.weighted and doc.coverage == 1.0 and doc.reviewed == 400
    assert (doc.agreement, doc.kappa, doc.precision, doc.recall) == want.rounded()
    assert doc.spot_checks == sum(c.verdict(f"c{i:05d}", 1) for i in range(400))
    assert plan1.records == decided["retry"]  # the reviewer's rejections run again
    for b in doc.buckets:  # per score bucket, the construction's share, counted directly
        rows = [
            (f"c{i:05d}", 1) for i in range(400) if c.score(f"c{i:05d}", 1) // 0.1 == float(b.bucket) * 10
        ]
        agree = sum(c.verdict(*r) == c.truth(*r) for r in rows) / len(rows)
        assert (b.rows, b.reviewed, b.agreement) == (len(rows), len(rows), round(agree, 4)), b

    retried = [(s["id"], 2) for f in JsonlDir(layout.reviewed(1)).jsonl_files() for s in f.iter_records()]
    decide_truthfully(cfg, 1)
    run_slot(cfg, "tail", STOP)
    doc1 = read_calibration(layout, 1)
    assert (
        doc1 is not None
        and (doc1.agreement, doc1.kappa, doc1.precision, doc1.recall) == c.expected(retried).rounded()
    )
    report = finished_report(cfg)
    assert [x["round"] for x in report["calibration"]] == [0, 1] and report["invariant"]["ok"]
    md = Path(layout.report, "report.md").read_text()
    assert "## Judge and reviewers" in md and f"| 0 | 400 | {doc.spot_checks} | {doc.agreement:.1%} |" in md
    assert Path(layout.report, "calibration.svg").read_text().startswith("<svg")


def test_a_sample_of_the_approvals_estimates_the_rounds_figures(tmp_path: Path) -> None:
    """About 10% of the approvals spot-checked and half of the rejections reviewed: the raw counts
    are exactly the reviewed rows', and the weighted figures land near the round's (counted from the
    construction) where the unweighted ones would not (about 0.44 for a recall of 0.80)."""
    cfg = spot_run(tmp_path, n=2_000, per_shard=500, spot_check_approved=200)
    layout = RunLayout(cfg.run_root)
    run_slot(cfg, "round-00")
    decide_truthfully(cfg, 0, share=0.5)
    view = RoundView(cfg.run_root, 0)
    reviewed = [s for s, _ in view.scan(prompts=False) if s.spot_check or c._u("look", s.id, 1) < 0.5]
    run_slot(cfg, "round-01", CONTINUE)
    doc = read_calibration(layout, 0)
    assert doc is not None and doc.reviewed == len(reviewed)
    tp = sum(1 for s in reviewed if c.verdict(s.id, 1) and c.truth(s.id, 1))
    assert doc.confusion.both_approve == tp
    assert doc.spot_checks == sum(s.spot_check for s in reviewed) > 80  # about 124
    population = c.expected((f"c{i:05d}", 1) for i in range(2_000))
    assert doc.agreement is not None and doc.kappa is not None and doc.recall is not None
    # the sample is the run's (seeded by its root): within about 4 standard errors of ~125 checks
    assert abs(doc.agreement - population.agreement) < 0.08
    assert abs(doc.kappa - population.kappa) < 0.16
    assert abs(doc.recall - population.recall) < 0.08
    unweighted_recall = tp / (tp + doc.confusion.judge_rejects_person_approves)
    assert population.recall - unweighted_recall > 0.2  # what the weights correct (about 0.36)
    # and the gate after the next round shows round 0's figures
    decide_truthfully(cfg, 1)
    body = review_body(cfg, Proposal(propose_slot(cfg, "tail").plan, last=read_summary(layout, 1)))
    assert (
        "**The judge against the reviewers**" in body
        and f"| 0 | {doc.reviewed} | {doc.agreement:.1%} |" in body
    )


def test_the_calibration_document_round_trips_and_refuses_unknown_fields(tmp_path: Path) -> None:
    from airflow_batchinfer.exceptions import StorageError
    from airflow_batchinfer.review.calibration import Pair, calibrate
    from airflow_batchinfer.state.docs.calibration import calibration_uri, write_calibration

    layout = RunLayout(str(tmp_path))
    doc = calibrate([Pair(True, True, 0.9), Pair(False, True, 0.1)], {"approved": {"0.9": 5}}, round=2)
    write_calibration(layout, doc)
    assert read_calibration(layout, 2) == doc and read_calibration(layout, 1) is None
    stored = json.loads(Path(calibration_uri(layout, 2)).read_text())
    assert stored["schema_version"] == DOC_VERSION and stored["round"] == 2
    Path(calibration_uri(layout, 2)).write_text(json.dumps({**stored, "extra": 1}))
    with pytest.raises(StorageError, match="judge calibration"):
        read_calibration(layout, 2)


# ------------------------------------------------------------------------------ a model judge's
@pytest.mark.parametrize(
    ("judge", "labels"),
    [({"type": "reward", "threshold": 0.0}, ("reward",)), ({"type": "classifier"}, ("rejected", "approved"))],
)
def test_a_model_judges_strata_are_its_score_tenths_only_when_its_scores_are_probabilities(
    tmp_path: Path, judge: dict[str, Any], labels: tuple[str, ...]
) -> None:
    """A reward or classifier judge on the judge pool (a scoring model at the engine seam) is spot
    checked like any judge. A classifier's P(label) is bucketed by its tenth; a reward's raw score
    (here -5 to 5) has no tenths, so its strata are its verdicts alone: in the judge jobs' counts and
    in the calibration alike, which then covers every judged row."""
    # every approval held back (30 of 30 rows: rate 1), so every judged row is reviewed below
    cfg = make_run(tmp_path, judge=judge, judge_pool="local://judges", spot_check_approved=30)
    write_run_config(cfg)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer", 0, s) for s in plan.shards], completion_tokens=4)
    run_jobs(cfg, [("judge", 0, s) for s in plan.shards], serving=HashScoringEngine(labels))
    summary = close(cfg, plan)
    judged = {**rows_in(layout.results), **rows_in(layout.rejected_dir(0))}
    assert summary["invariant"]["ok"] and len(judged) == 30 and not rows_in(layout.results)
    assert (
        0
        < summary["spot_checks"]
        == sum(r["judgment"].get("judge_approved", False) for r in judged.values())
        < 30
    )
    want: dict[str, dict[str, int]] = {}
    for row in judged.values():
        j = row["judgment"]
        stratum = "approved" if j.get("judge_approved", j["approved"]) else "rejected"
        bucket = score_bucket(j["score"]) if judge["type"] == "classifier" else "none"
        want.setdefault(stratum, {}).setdefault(bucket, 0)
        want[stratum][bucket] += 1
    assert summary["verdicts"] == want
    buckets = {b for by in want.values() for b in by}
    if judge["type"] == "reward":  # no clamping of raw rewards into the edge tenths
        assert buckets == {"none"}
    else:
        assert len(buckets) > 2 and "none" not in buckets

    # every row on the desk decided by its id, as the judge said: the figures cover the round
    log = DecisionLog(cfg.run_root, 0)
    for sample, _ in RoundView(cfg.run_root, 0).scan(prompts=False):
        log.append(Decision.make(0, "accept" if sample.spot_check else "retry", "alice", ids=[sample.id]))
    apply_choice(cfg, propose_slot(cfg, "round-01"), STOP)
    doc = read_calibration(layout, 0)
    assert doc is not None and doc.weighted and doc.coverage == 1.0 and doc.agreement == 1.0
    assert [b.bucket for b in doc.buckets] == [b for b in BUCKETS if any(b in by for by in want.values())]
