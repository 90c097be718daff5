"""Reviewers' decisions take effect at the gate's answer: accepted rows go to results (marked), dropped
rows to dropped/ with the note, the rest stays pending for the next round; the plan, the round's
close and the run's report account for every id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_batchinfer.exceptions import ReviewClosedError
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision, DecisionLog
from airflow_batchinfer.run.plan import CONTINUE, STOP, apply_choice, pending_shards, propose_slot
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, shard_dataset
from airflow_batchinfer.storage.parquet_columns import Column, OutputColumns, write_columns
from tests.support.fake_jobs import IDS, close, finish_shard, make_run, plan_round
from tests.support.review_runs import finished_report, rows_in


def reviewed_run(tmp_path: Path, output_format: str = "jsonl") -> Any:
    """Round 0 approves r00–r19; r20–r29 are rejected and await review before round 1."""
    cfg = make_run(tmp_path, review="every_round", max_rounds=2, output_format=output_format)
    if output_format == "parquet":  # as prepare_run pins them: the input's question a column of its own
        pinned = OutputColumns(columns=[Column(name="question", type="string")], source="test")
        write_columns(RunLayout(cfg.run_root).output_columns, pinned)
    plan = plan_round(cfg)
    for shard in plan.shards:
        finish_shard(cfg, 0, shard, set(IDS[:20]))
    close(cfg, plan)
    log = DecisionLog(cfg.run_root, 0)
    log.append(Decision.make(0, "accept", "alice", ids=["r20", "r21", "r22"]))
    log.append(Decision.make(0, "drop", "alice", ids=["r23", "r24"], note="duplicates of r1"))
    log.append(Decision.make(0, "retry", "bob", ids=["r22"]))  # a later decision wins
    return cfg


def unseal(cfg: Any) -> None:
    """What an operator does to change round 0's decisions after they were applied: remove the seal
    (the log's last line), then clear the plan task."""
    path = Path(RunLayout(cfg.run_root).decisions(0))
    lines = path.read_text().splitlines(keepends=True)
    assert "sealed_at" in lines[-1]
    path.write_text("".join(lines[:-1]))


@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])
def test_decisions_split_the_pending_set_and_every_id_is_accounted_for(
    tmp_path: Path, output_format: str
) -> None:
    cfg = reviewed_run(tmp_path, output_format)
    layout = RunLayout(cfg.run_root)
    samples = RoundView(cfg.run_root, 0).page(size=100).samples  # the desk reads rejected/ in either format
    assert [s.id for s in samples] == IDS[20:] and samples[0].record == {"id": "r20", "question": "q r20"}
    proposal = propose_slot(cfg, "round-01")
    assert proposal.options and proposal.plan.records == 10
    plan = apply_choice(cfg, proposal, CONTINUE, by="review (alice)")
    assert plan.mode == "rounds" and plan.reviewed is not None
    assert plan.reviewed.counts == {"accept": 2, "retry": 6, "drop": 2} and plan.reviewed.decisions == 3
    assert sorted(rows_in(layout.reviewed(1))) == ["r22", "r25", "r26", "r27", "r28", "r29"]
    assert plan.records == 6 and {s.uri for s in plan.shards} <= {
        f.uri for f in JsonlDir(layout.reviewed(1)).jsonl_files()
    }
    assert [s.records for s in pending_shards(layout, 1)] == [s.records for s in plan.shards]
    results = rows_in(layout.results)
    assert {i for i, r in results.items() if r.get("accepted_by_review")} == {"r20", "r21"}
    person = results["r20"]["judgment"]["person"]
    assert (person["by"], person["action"]) == ("alice", "accept")
    dropped = rows_in(layout.dropped)
    assert (
        sorted(dropped) == ["r23", "r24"]
        and dropped["r23"]["judgment"]["person"]["note"] == "duplicates of r1"
    )

    write_plan(layout, plan)
    for shard in plan.shards:
        finish_shard(cfg, 1, shard, {"r25"})
    summary = close(cfg, plan)
    assert summary["pending"] == 6 and summary["approved"] == 1 and summary["invariant"]["ok"]
    write_plan(layout, propose_slot(cfg, "tail").plan)
    report = finished_report(cfg)
    assert report["invariant"]["ok"] and report["invariant"]["checked"] == "digests"
    assert (report["accepted_by_review"], report["dropped_by_review"], report["remaining_pending"]) == (
        2,
        2,
        5,
    )
    assert report["reviews"][0]["counts"] == {"accept": 2, "retry": 6, "drop": 2}
    assert "## Review decisions" in (Path(layout.report) / "report.md").read_text()
    # results/, rejected/ and dropped/ in the run's format; what the next round reads stays JSONL
    ending = ".parquet" if output_format == "parquet" else ".jsonl.zst"
    outputs = [*Path(layout.results).iterdir(), *Path(layout.dropped).iterdir()]
    outputs += Path(layout.rejected_dir(0)).iterdir()
    assert outputs and all(p.name.endswith(ending) for p in outputs)
    assert all(p.name.endswith(".jsonl.zst") for p in Path(layout.reviewed(1)).glob("part-*"))
    # a Parquet run's final pending rows, in Parquet too: with results/ and dropped/, every id once
    if output_format == "parquet":
        left = rows_in(layout.final_pending)
        assert len(left) == 5 and not set(left) & (set(rows_in(layout.results)) | set(dropped))
        assert len(left) + len(rows_in(layout.results)) + len(dropped) == len(IDS)
        # every file a close, the review or the report wrote has the pinned column, filled
        for path in [*outputs, *Path(layout.final_pending).iterdir()]:
            table = pq.read_table(path)
            assert table.column_names[:2] == ["id", "question"], path
            assert table.column("question").to_pylist() == [f"q {i}" for i in table.column("id").to_pylist()]
    else:
        assert not Path(layout.final_pending).exists()


def test_a_retried_plan_task_applies_the_same_decisions_and_later_ones_are_refused(tmp_path: Path) -> None:
    """The first application seals the log: a decision made after it is refused (never recorded and
    ignored), and a retried plan task applies exactly the same decisions."""
    cfg = reviewed_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    first = apply_choice(cfg, propose_slot(cfg, "round-01"), CONTINUE)
    with pytest.raises(ReviewClosedError):
        DecisionLog(cfg.run_root, 0).append(Decision.make(0, "drop", "carol", ids=["r25"]))
    again = apply_choice(cfg, propose_slot(cfg, "round-01"), CONTINUE)
    assert again.reviewed == first.reviewed and again.reviewed is not None
    assert again.reviewed.counts == {"accept": 2, "retry": 6, "drop": 2}
    assert sorted(rows_in(layout.reviewed(1))) == ["r22", "r25", "r26", "r27", "r28", "r29"]
    assert sorted(rows_in(layout.dropped)) == ["r23", "r24"]


def test_a_log_an_operator_edited_is_applied_as_it_is_now(tmp_path: Path) -> None:
    """An operator unseals the log, changes the decisions by hand and clears the plan task: the retry
    applies the log as it is now; files the earlier split made that it no longer makes are removed
    (no id is doubled), and it reads the original pending set."""
    cfg = reviewed_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    apply_choice(cfg, propose_slot(cfg, "round-01"), CONTINUE)
    unseal(cfg)
    DecisionLog(cfg.run_root, 0).append(Decision.make(0, "retry", "carol", ids=["r20", "r21", "r23", "r24"]))
    plan = apply_choice(cfg, propose_slot(cfg, "round-01"), STOP)
    assert plan.stop and plan.reviewed is not None
    assert plan.reviewed.counts == {"accept": 0, "retry": 10, "drop": 0}
    assert not any(r.get("accepted_by_review") for r in rows_in(layout.results).values())
    assert rows_in(layout.dropped) == {}
    write_plan(layout, plan)
    report = finished_report(cfg)
    assert report["invariant"]["ok"] and report["remaining_pending"] == 10


def test_a_bulk_decision_by_reason_group_and_no_log_no_split(tmp_path: Path) -> None:
    def closed_round(root: Path) -> Any:
        root.mkdir()
        cfg = make_run(root, review="every_round", max_rounds=2)
        plan = plan_round(cfg)
        for shard in plan.shards:
            finish_shard(cfg, 0, shard, set(IDS[:25]))
        close(cfg, plan)
        return cfg

    plain_cfg = closed_round(tmp_path / "plain")
    plain = apply_choice(plain_cfg, propose_slot(plain_cfg, "round-01"), CONTINUE)
    assert plain.reviewed is None and not Path(RunLayout(plain_cfg.run_root).reviewed(1)).exists()
    cfg = closed_round(tmp_path / "bulk")
    DecisionLog(cfg.run_root, 0).append(
        Decision.make(0, "drop", "alice", filter={"group": "no"}, note="junk")
    )
    decided = apply_choice(cfg, propose_slot(cfg, "round-01"), CONTINUE)
    assert decided.mode == "skip" and decided.stop == "nothing pending"  # every pending row was decided
    assert decided.reviewed is not None and decided.reviewed.counts["drop"] == 5
    write_plan(RunLayout(cfg.run_root), decided)
    assert finished_report(cfg)["invariant"]["ok"]
    dropped = rows_in(RunLayout(cfg.run_root).dropped)
    assert sorted(dropped) == IDS[25:] and {r["judgment"]["person"]["note"] for r in dropped.values()} == {
        "junk"
    }


def test_a_run_whose_rounds_did_not_all_plan_or_close_is_incomplete(tmp_path: Path) -> None:
    """The report of a DAG run whose upstream task failed (no plan for a slot, or a round that ran
    without closing) says so, instead of "complete" (its task then fails)."""
    cfg = make_run(tmp_path, max_rounds=2)
    plan = plan_round(cfg)
    report = build_report(cfg)
    assert report["status"] == "incomplete" and "not closed" in report["stop_reason"]
    for shard in plan.shards:
        finish_shard(cfg, 0, shard, set(IDS))
    close(cfg, plan)
    report = build_report(cfg)
    assert report["status"] == "incomplete" and "round-01, tail not planned" in report["stop_reason"]
    for slot in ("round-01", "tail"):
        write_plan(RunLayout(cfg.run_root), propose_slot(cfg, slot).plan)
    assert build_report(cfg)["status"] == "complete"


def test_decisions_take_effect_once_per_round_and_the_report_points_at_what_is_pending(
    tmp_path: Path,
) -> None:
    """Continue in place at round 1's gate: the tail retries in place without a second gate on the
    same round (the decisions took effect once); the report counts them once and names the pending
    set they left."""
    cfg = reviewed_run(tmp_path)
    cfg = cfg.replace(strategy="hybrid")
    layout = RunLayout(cfg.run_root)
    switch = apply_choice(cfg, propose_slot(cfg, "round-01"), "Continue in place")
    assert switch.switch_in_place and switch.reviewed is not None
    write_plan(layout, switch)
    tail = propose_slot(cfg, "tail")
    assert tail.plan.mode == "in_place" and tail.options == [] and tail.plan.records == 6
    stop = apply_choice(cfg, propose_slot(cfg, "round-01"), STOP)  # a retried gate task answers again
    write_plan(layout, stop)
    write_plan(layout, propose_slot(cfg, "tail").plan)
    report = finished_report(cfg)
    assert (report["accepted_by_review"], report["dropped_by_review"], len(report["reviews"])) == (2, 2, 1)
    assert report["remaining_pending_uri"] == layout.reviewed(1) and report["invariant"]["ok"]


def test_accept_remaining_after_decisions_and_again(tmp_path: Path) -> None:
    """ "Accept remaining" accepts what the decisions left; answered again after an operator changed
    the decisions, it leaves no earlier acceptance behind (no id doubled)."""
    cfg = reviewed_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = apply_choice(cfg, propose_slot(cfg, "round-01"), "Accept remaining as they are")
    write_plan(layout, plan)
    assert finished_report(cfg)["invariant"]["ok"]
    unseal(cfg)
    DecisionLog(cfg.run_root, 0).append(Decision.make(0, "drop", "carol", filter={}, note="all of it"))
    plan = apply_choice(cfg, propose_slot(cfg, "round-01"), "Accept remaining as they are")
    write_plan(layout, plan)
    report = finished_report(cfg)
    assert report["invariant"]["ok"] and report["dropped_by_review"] == 10
    assert not [r for r in rows_in(layout.results).values() if r.get("accepted_by_review")]


def test_a_human_judges_gate_offers_no_in_place(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, judge={"type": "human"}, max_rounds=2)
    plan = plan_round(cfg)
    for shard in plan.shards:
        finish_shard(cfg, 0, shard, set())
    close(cfg, plan)
    assert propose_slot(cfg, "round-01").options == [CONTINUE, "Accept remaining as they are", STOP]


def test_the_desk_shows_the_prompts_the_round_ran(tmp_path: Path) -> None:
    """A round run with a review's changed template shows (and text filters search) that prompt."""
    from airflow_batchinfer.review.browse import RoundView
    from airflow_batchinfer.state.config import round_config
    from airflow_batchinfer.state.docs import write_run_config

    cfg = make_run(tmp_path)
    write_run_config(cfg)
    assert RoundView(cfg.run_root, 0).to_sample({"id": "x", "question": "q x"}).prompt == "q x"
    plan = propose_slot(cfg, "round-00").plan
    plan.settings = {"prompt_template": "Q: {{ question }}"}
    plan.config = round_config(cfg, plan.settings)  # as the plan step computes it
    write_plan(RunLayout(cfg.run_root), plan)
    for shard in plan.shards:
        finish_shard(plan.config, 0, shard, set(IDS[:20]))
    close(cfg, plan)
    (sample,) = RoundView(cfg.run_root, 0).sample(1)
    assert sample.prompt == f"Q: q {sample.id}"


@pytest.mark.security
def test_a_records_own_review_field_is_never_overwritten_by_a_decision(tmp_path: Path) -> None:
    """Issue 37 item 6: accept and drop decisions record the person's verdict under the system's
    names (``judgment.person``, ``accepted_by_review``), never over a record's own ``review`` (its
    product-review text, say) in results/ and dropped/; nor does a retry (``sent_back``)."""
    texts = {i: f"five stars, would buy {i} again" for i in IDS}
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"id": i, "question": f"q {i}", "review": texts[i]}) + "\n" for i in IDS)
    )
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        records_per_shard=10,
        judge={"type": "llm"},
        review="every_round",
        max_rounds=2,
    )
    cfg = cfg.replace(
        id_field=shard_dataset(str(data), RunLayout(cfg.run_root).input, records_per_shard=10).id_field
    )
    plan = plan_round(cfg)
    for shard in plan.shards:
        finish_shard(cfg, 0, shard, set(IDS[:20]))
    close(cfg, plan)
    log = DecisionLog(cfg.run_root, 0)
    log.append(Decision.make(0, "accept", "alice", ids=["r20", "r21"], note="fine"))
    log.append(Decision.make(0, "drop", "alice", ids=["r23"], note="spam"))
    log.append(Decision.make(0, "retry", "bob", ids=["r24"], note="again"))
    apply_choice(cfg, propose_slot(cfg, "round-01"), CONTINUE, by="review (alice)")
    layout = RunLayout(cfg.run_root)
    results, dropped, retried = rows_in(layout.results), rows_in(layout.dropped), rows_in(layout.reviewed(1))
    for rows in (results, dropped, retried):
        assert {i: r["review"] for i, r in rows.items()} == {i: texts[i] for i in rows}
    assert results["r20"]["accepted_by_review"] is True
    assert {k: results["r20"]["judgment"]["person"][k] for k in ("action", "by", "note")} == {
        "action": "accept", "by": "alice", "note": "fine"
    }  # fmt: skip
    assert (
        dropped["r23"]["judgment"]["person"]["action"] == "drop"
        and "accepted_by_review" not in dropped["r23"]
    )
    assert retried["r24"]["sent_back"]["note"] == "again"
