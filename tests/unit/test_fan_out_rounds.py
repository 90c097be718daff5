"""Round 0's fan-out through rounds (issue 25, item 5): every input record once per adapter and on
the base model, as rows with ids ``ID@ARM``, read from byte ranges of the input (nothing copied) or
from the copy of an input that cannot be split. The worker's own job code runs every job (SIMULATED
engine: an adapter's answers are hashed with its name, approval with the row's id); close runs as
the DAG's close task runs it. Checked: the id invariant over rows (bad lines, a record that picks
its own adapter, an id repeated across ranges, a quarantined range, the next round), the approval
per arm in the summaries and the report (spot checks apart, and those that followed the judge in the
report's approved), the counts users see. The real engine over HTTP:
tests/component/test_worker_engines.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import OutputExistsError
from airflow_batchinfer.review.decisions import Decision, DecisionLog
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import job_spec, round_kinds
from airflow_batchinfer.run.plan import STOP, apply_choice, pending_shards, propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.run.repeats import _uncount
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.invariant import check_invariant
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import AcceptedJob, Plan, Summary, read_job_manifest, read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.state.tally import AdapterTally, Generated, Outcomes, Tally
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.id_hashes import REJECTS_SUFFIX
from airflow_batchinfer.storage.manifest import read_manifest
from tests.support.rounds import rows_in
from tests.support.worker_jobs import run_jobs

ARMS = ("base", "poems", "sql")
ADAPTERS = {"sql": "/models/lora-sql", "poems": "/models/lora-poems"}


def fan_out_run(tmp_path: Path, lines: list[str], name: str = "data.jsonl", **settings: Any) -> RunConfig:
    data = tmp_path / name
    if name.endswith(".zst"):
        import zstandard

        data.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    else:
        data.write_text("\n".join(lines) + "\n")
    settings = {"judge": {"type": "llm"}, "records_per_shard": 12, "fan_out": "adapters_and_base", **settings}
    return RunConfig.of(
        input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ question }}", adapters=ADAPTERS,
        **settings,
    )  # fmt: skip


def planned(cfg: RunConfig, slot: str) -> Plan:
    plan = propose_slot(cfg, slot).plan
    write_plan(RunLayout(cfg.run_root), plan)
    return plan


def run_round(cfg: RunConfig, plan: Plan, skip_last: bool = False) -> dict[str, Any]:
    shards = plan.shards[:-1] if skip_last else plan.shards
    run_jobs(
        cfg, [(k, plan.round, s) for k in round_kinds(cfg, plan.mode) for s in shards], approval_rate=0.5
    )
    summary = close_round(cfg, plan)
    assert summary is not None
    return summary


def per_arm(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["adapter"] for r in rows)


@pytest.mark.parametrize("judge_pool", [None, "local://judges"])  # infer_judge; infer, then judge
def test_every_record_runs_once_per_arm_through_rounds_and_every_row_id_is_accounted(
    tmp_path: Path, judge_pool: str | None
) -> None:
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(24)]
    lines[5] = json.dumps({"id": "r05", "question": "mine", "adapter": "sql"})  # picks its own: refused
    lines[9] = "{bad"
    lines[20] = json.dumps({"id": "r03", "question": "again"})  # r03 again, in a later range
    cfg = fan_out_run(tmp_path, lines, judge_pool=judge_pool)
    layout = RunLayout(cfg.run_root)
    shards = prepare_run(cfg).shards
    # ranges of 4 lines (records_per_shard 12 rows / 3 arms), each counted as its rows; nothing copied
    assert len(shards) == 6 and all(s.fan_out == tuple(ARMS) and s.is_range for s in shards)
    assert all(s.records % 3 == 0 for s in shards)  # estimates (from the input's line lengths) × 3
    assert JsonlDir(layout.input).shards() == []

    plan = planned(cfg, "round-00")
    summary = run_round(cfg, plan, skip_last=True)  # the last range's job never ran: close reads it
    assert summary["invariant"]["ok"], summary["invariant"]
    # 22 lines read (24 less the bad one and the one that picks its adapter), 3 rows each
    assert summary["pending"] == summary["invariant"]["planned"] == summary["ids"]["planned"]["count"] == 66
    assert summary["repeated_ids"] == 3  # r03's later line: its 3 rows, rejected
    approved, rejected = rows_in(layout.results), rows_in(layout.rejected_dir(0))
    failed, lost = summary["failed_shards"][0], summary["failed_records"]  # the quarantined range's rows
    assert failed["shard_id"] == plan.shards[-1].shard_id and lost > 0 and lost % 3 == 0
    assert summary["approved"] + summary["rejected"] + lost + summary["repeated_ids"] == 66
    # every judged row is one of its record's arms: its id, adapter and input_id agree
    judged = approved + rejected
    assert len({r["id"] for r in judged}) == len(judged) == 66 - lost - 3
    assert all(r["id"] == f"{r['input_id']}@{r['adapter']}" and r["adapter"] in ARMS for r in judged)
    by_record: dict[str, set[str]] = {}
    for r in judged:
        by_record.setdefault(r["input_id"], set()).add(r["adapter"])
    assert len(by_record) == len(judged) // 3 and all(arms == set(ARMS) for arms in by_record.values())
    assert "r05" not in by_record and by_record["r03"] == set(ARMS)
    # each arm its own answer to the same question (the simulated engine hashes the adapter in)
    answers: dict[str, set[str]] = {}
    for r in judged:
        answers.setdefault(r["input_id"], set()).add(r["result"])
    assert sum(len(a) == 3 for a in answers.values()) >= len(answers) - 1
    # approval per arm: the judged rows it answered (the repeat's rows left out)
    ok, bad = per_arm(approved), per_arm(rejected)
    assert summary["adapters"] == {
        arm: {
            "approved": ok[arm],
            "rejected": bad[arm],
            "approval_rate": round(ok[arm] / (ok[arm] + bad[arm]), 4),
        }
        for arm in ARMS
    }
    # rejects/: the bad line, the record that picked its adapter, and each of the repeated line's rows
    rejects = sorted((r for f in JsonlDir(layout.rejects).jsonl_files() for r in f.iter_records()),
                     key=lambda r: (r["line_no"], str(r.get("id"))))  # fmt: skip
    assert [r["line_no"] for r in rejects] == [6, 10, 21, 21, 21]
    assert "its adapter field 'sql' picks one adapter, but fan_out runs every record" in rejects[0]["error"]
    assert [r["id"] for r in rejects[2:]] == ["r03@base", "r03@poems", "r03@sql"]
    assert all(r["error"].endswith("repeated (first at line 4)") for r in rejects[2:])
    repeat_files = [f for f in JsonlDir(layout.rejects).jsonl_files() if f.uri.endswith(REJECTS_SUFFIX)]
    assert len(repeat_files) == 1
    # the input's counts stay the file's lines; its shards' records became the rows read
    manifest = read_manifest(JsonlDir(layout.input))
    assert manifest is not None and manifest.counts == {
        "lines": 24,
        "records": 22,
        "blank": 0,
        "skipped": 0,
        "quarantined": 2,
    }
    assert sum(s.records for s in manifest.shards) == 66  # r03's later line's rows too (rejected)

    # round 1: the rejected rows (the quarantined range stays in failed/)
    plan1 = planned(cfg, "round-01")
    second = run_round(cfg, plan1)
    assert second["invariant"]["ok"] and second["pending"] == summary["rejected"]
    retried = [r for r in rows_in(layout.results) if r["round"] == 1] + rows_in(layout.rejected_dir(1))
    assert sorted(r["id"] for r in retried) == sorted(r["id"] for r in rejected)
    assert all(r["id"] == f"{r['input_id']}@{r['adapter']}" for r in retried)  # each with its own arm
    assert {a: c["approved"] + c["rejected"] for a, c in second["adapters"].items()} == dict(per_arm(retried))

    # the run's report: every row id once, by digests and by reading the ids (ranges read as rows)
    report = build_report(cfg)
    assert report["invariant"]["ok"] and report["invariant"]["input"] == 66, report["invariant"]
    assert report["fan_out"] == {"arms": list(ARMS), "rows": 66}
    pending = pending_shards(layout, 2)
    summaries = [Summary.model_validate({**s, "ids": {}}) for s in (summary, second)]
    undigested = [s.model_copy(update={"ids": None}) for s in pending]
    failed_docs = [f for s in summaries for f in s.failed_shards]
    by_ids = check_invariant(layout, "id", undigested, summaries, failed_docs, plans=[plan, plan1])
    assert by_ids["ok"] and by_ids["checked"] == "ids" and by_ids["input"] == 66, by_ids
    markdown = render_markdown(report)
    assert "- fan-out: every input record once on each of base, poems, sql: 66 rows (ID@ARM)" in markdown
    table = markdown.split("## Adapters")[1].splitlines()
    assert [row.split(" | ")[1] for row in table[4:7]] == list(ARMS)  # round 0: base, poems, sql


def test_an_input_that_cannot_be_split_is_copied_as_its_rows(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "question": f"q {i}"}) for i in range(10)]  # number ids: "3@sql"
    lines[4] = json.dumps({"id": 4, "question": "x", "adapter": "poems"})
    cfg = fan_out_run(tmp_path, lines, "data.jsonl.zst", fan_out="adapters")  # one zstd frame
    result = prepare_run(cfg)
    assert all(not s.is_range for s in result.shards)  # the copy holds the rows
    assert [s.records for s in result.shards] == [12, 6] and result.counts["quarantined"] == 1
    copied = rows_in(RunLayout(cfg.run_root).input)
    assert [r["id"] for r in copied[:4]] == ["0@poems", "0@sql", "1@poems", "1@sql"]
    assert copied[0]["input_id"] == 0 and copied[0]["adapter"] == "poems"
    summary = run_round(cfg, planned(cfg, "round-00"))
    assert summary["invariant"]["ok"] and summary["pending"] == 18
    assert sorted(summary["adapters"]) == ["poems", "sql"]
    assert sum(a["approved"] + a["rejected"] for a in summary["adapters"].values()) == 18
    assert prepare_run(cfg.replace(id_field=None)).reused  # a retried shard task: reused
    # another fan-out is another input: refused, never mixed with the copy made for this one
    other = cfg.replace(id_field=None, fan_out="adapters_and_base")
    with pytest.raises(OutputExistsError, match="with other inputs or settings"):
        prepare_run(other)


def test_in_place_retries_each_row_with_its_arm(tmp_path: Path) -> None:
    lines = [json.dumps({"id": f"r{i}", "question": f"q {i}"}) for i in range(8)]
    cfg = fan_out_run(tmp_path, lines, strategy="in_place", max_attempts=2, fan_out="adapters")
    prepare_run(cfg)
    summary = run_round(cfg, planned(cfg, "tail"))
    assert summary["invariant"]["ok"] and summary["pending"] == 16
    assert {a: c["approved"] + c["rejected"] for a, c in summary["adapters"].items()} == {
        "poems": 8,
        "sql": 8,
    }


def test_a_run_without_fan_out_plans_and_asks_as_before(tmp_path: Path) -> None:
    """Its descriptors, range plan and jobs' params carry nothing of fan-outs: job ids and
    fingerprints as before the setting existed."""
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(24)]
    cfg = fan_out_run(tmp_path, lines, fan_out="off")
    shards = prepare_run(cfg).shards
    manifest = read_manifest(JsonlDir(RunLayout(cfg.run_root).input))
    assert (
        manifest is not None
        and "fan_out" not in (manifest.fingerprint or {})
        and all(s.is_range and s.fan_out is None for s in shards)
    )
    assert len(shards) == 2  # about records_per_shard lines each
    params = job_spec(cfg, "infer_judge", 0, PlannedShard.of(shards[0])).params
    assert "fan_out" not in params["input_range"] and "fan_out" not in params


def test_spot_checks_count_apart_per_arm_and_the_reports_table_agrees_with_its_approved_total(
    tmp_path: Path,
) -> None:
    """Every approval spot-checked (rate 1): a held spot check is neither approved nor rejected under
    its arm, but among the judge's approvals (the arm's approval); a repeated line's rows leave those
    counts too; the spot checks no reviewer decided follow the judge into results, and the report's
    table adds them to its round's approved, as the report's approved total does."""
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(24)]
    lines[20] = json.dumps({"id": "r03", "question": "again"})  # r03 again, in a later range
    cfg = fan_out_run(tmp_path, lines, spot_check_approved=1_000, max_rounds=2)
    layout = RunLayout(cfg.run_root)
    prepare_run(cfg)
    plan = planned(cfg, "round-00")
    summary = run_round(cfg, plan)
    assert summary["invariant"]["ok"] and summary["repeated_ids"] == 3
    rejected = rows_in(layout.rejected_dir(0))
    spots = [r for r in rejected if r["judgment"].get("spot_check")]
    assert rows_in(layout.results) == [] and summary["approved"] == 0  # every approval held for people
    held, bad = per_arm(spots), per_arm([r for r in rejected if not r["judgment"].get("spot_check")])
    assert summary["spot_checks"] == len(spots) == sum(held.values()) > 0
    assert summary["adapters"] == {
        arm: {
            "approved": 0,
            "rejected": bad[arm],
            "spot_checks": held[arm],
            "approval_rate": round(held[arm] / (held[arm] + bad[arm]), 4),
        }
        for arm in ARMS
    }
    # the repeated line's rows were counted by their job, spot checks among them, then left out
    jobs = [read_job_manifest(layout.job_manifest(0, s.shard_id, "infer_judge")) for s in plan.shards]
    counted = sum((m.counts for m in jobs if m is not None), Tally())
    assert len(jobs) == len(plan.shards) and None not in jobs
    assert counted.outcomes.spot_checks > summary["spot_checks"]
    assert sum(counted.adapters[arm].spot_checks for arm in ARMS) == counted.outcomes.spot_checks

    # people decide a few spot checks; the others follow the judge when the gate is answered
    sql = sorted(r["id"] for r in spots if r["adapter"] == "sql")
    log = DecisionLog(cfg.run_root, 0)
    log.append(Decision.make(0, "accept", "ann", ids=sql[:1]))
    log.append(Decision.make(0, "drop", "ann", ids=sql[1:2]))
    log.append(Decision.make(0, "retry", "ann", ids=sql[2:3]))
    proposal = propose_slot(cfg, "round-01")
    write_plan(layout, apply_choice(cfg, proposal, STOP, by="review (ann)"))
    for slot in ("round-01", "tail"):
        if read_plan(layout, slot) is None:
            write_plan(layout, propose_slot(cfg, slot).plan)
    report = build_report(cfg)
    assert report["invariant"]["ok"]
    followed = per_arm([r for r in rows_in(layout.results) if not r.get("accepted_by_review")])
    assert followed == held - Counter({"sql": 3}) and report["approved"] == sum(followed.values())
    table = render_markdown(report).split("## Adapters")[1].splitlines()
    assert table[2] == "| round | adapter | approved | spot checks | rejected | approval |"
    shown = {row.split(" | ")[1]: row.split(" | ") for row in table[4:7]}
    assert {arm: int(cells[2]) for arm, cells in shown.items()} == dict(followed)
    assert sum(int(cells[2]) for cells in shown.values()) == report["approved"]  # the table agrees
    assert {arm: int(cells[3]) for arm, cells in shown.items()} == dict(held)


def test_a_left_out_spot_check_leaves_its_arms_count() -> None:
    """A repeat's row taken out of its job's counts as the job counted it (worker.jobs.judge, repeats)."""
    counts = Tally(
        generated=Generated(ok=2),
        outcomes=Outcomes(rejected=2, for_review=2, spot_checks=1),
        adapters={"sql": AdapterTally(spot_checks=1, rejected=1)},
    )
    doc = AcceptedJob.model_construct(kind="infer_judge", counts=counts, reason_groups={})
    judgment = {"approved": False, "for_review": True, "spot_check": True, "judge_approved": True}
    spot = {"id": "a@sql", "adapter": "sql", "status": "rejected", "error": None, "judgment": judgment}
    _uncount(doc, spot, "rejected")
    assert doc.counts == Tally(
        generated=Generated(ok=1),
        outcomes=Outcomes(rejected=1, for_review=1),
        adapters={"sql": AdapterTally(rejected=1)},
    )
