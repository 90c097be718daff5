"""Round decisions and the round close, over real files on local disk (no pool: job manifests are
written as a worker would)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.gate.changes import current_settings, gate_changes
from airflow_batchinfer.run.jobs import job_spec, record_job_error
from airflow_batchinfer.run.plan import (
    ACCEPT,
    CONTINUE,
    CONTINUE_IN_PLACE,
    MAX_ROUNDS,
    NOTHING_PENDING,
    STOP,
    STOPPED_BY_REVIEW,
    apply_choice,
    propose_slot,
)
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage import JsonlDir
from tests.support.fake_jobs import finish_shard
from tests.support.rounds import fake_round, make_run


def test_round_zero_runs_the_input_shards_without_review(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, review="every_round")
    proposal = propose_slot(cfg, "round-00")
    assert proposal.plan.mode == "rounds" and proposal.plan.records == 30 and proposal.options == []


def test_rounds_recompact_rejected_and_stop_at_max_rounds(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=2)
    s0 = fake_round(cfg, "round-00", {f"r{i:02d}" for i in range(20)})
    assert (s0["approved"], s0["rejected"], s0["next_pending"]) == (20, 10, 10) and s0["invariant"]["ok"]
    assert s0["job_seconds"] == 3.0  # 3 shards x 1 s: one fused infer_judge job per shard
    s1 = fake_round(cfg, "round-01", {"r25"})
    assert s1["pending"] == 10 and s1["approved"] == 1
    tail = propose_slot(cfg, "tail").plan
    assert tail.mode == "skip" and tail.stop == MAX_ROUNDS and tail.records == 9


def test_nothing_pending_stops_and_later_slots_skip(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=3)
    fake_round(cfg, "round-00", {f"r{i:02d}" for i in range(30)})
    plan = propose_slot(cfg, "round-01").plan
    assert plan.stop == NOTHING_PENDING
    write_plan(RunLayout(cfg.run_root), plan)
    later = propose_slot(cfg, "round-02").plan
    assert later.mode == "skip" and later.stop is None and "stopped at round-01" in later.reason


def test_review_modes_decide_when_a_gate_opens(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, review="on_low_approval", review_min_approval=0.5)
    fake_round(cfg, "round-00", {f"r{i:02d}" for i in range(20)})  # 67% approved: no gate
    assert propose_slot(cfg, "round-01").options == []
    cfg = cfg.replace(review_min_approval=0.9)
    assert propose_slot(cfg, "round-01").options == [CONTINUE, CONTINUE_IN_PLACE, ACCEPT, STOP]
    cfg = cfg.replace(review="every_round")
    assert propose_slot(cfg, "tail").options == [CONTINUE_IN_PLACE, ACCEPT, STOP]


def test_review_choices(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, review="every_round")
    fake_round(cfg, "round-00", {f"r{i:02d}" for i in range(25)})
    proposal = propose_slot(cfg, "round-01")
    assert apply_choice(cfg, proposal, CONTINUE).mode == "rounds"
    stop = apply_choice(cfg, proposal, STOP)
    assert stop.mode == "skip" and stop.stop == STOPPED_BY_REVIEW
    switch = apply_choice(cfg, proposal, CONTINUE_IN_PLACE, by="alice")
    assert switch.switch_in_place and switch.review == {
        "choice": CONTINUE_IN_PLACE, "by": "alice", "proposed": "rounds",
        "proposed_reason": proposal.plan.reason,
    }  # fmt: skip
    write_plan(RunLayout(cfg.run_root), switch)
    assert propose_slot(cfg, "round-02").plan.mode == "skip"
    assert propose_slot(cfg, "tail").plan.mode == "in_place"  # the tail takes the pending set in place
    with pytest.raises(ConfigError, match="not one of"):
        apply_choice(cfg, proposal, "Maybe")

    accept = apply_choice(cfg, proposal, ACCEPT)
    rows = [r for f in JsonlDir(RunLayout(cfg.run_root).results).jsonl_files() for r in f.iter_records()]
    accepted = [r for r in rows if r.get("accepted_by_review")]
    assert len(accepted) == 5 and accept.stop and "accepted 5" in accept.reason


def test_continue_with_changes_holds_for_the_next_rounds_and_enters_the_job_ids(tmp_path: Path) -> None:
    cfg = make_run(
        tmp_path, review="every_round", max_rounds=3, sampling={"temperature": 0.7, "max_tokens": 8}
    )
    fake_round(cfg, "round-00", {f"r{i:02d}" for i in range(25)})
    proposal = propose_slot(cfg, "round-01")
    now = current_settings(proposal.plan.effective_config(cfg))
    assert now == {
        "temperature": 0.7, "max_tokens": 8, "prompt_template": "{{ question }}", "system": None,
        "retry_template": None,
    }  # fmt: skip
    answered = {"temperature": 1.1, "max_tokens": 8, "prompt_template": None, "system": "Be brief.",
                "retry_template": None}  # fmt: skip
    changes = gate_changes(now, answered)
    assert changes == {
        "temperature": 1.1,
        "system": "Be brief.",
    }  # unchanged and empty values are not changes
    plan = apply_choice(cfg, proposal, CONTINUE, by="alice", changes=changes)
    assert plan.settings == changes and plan.review is not None and plan.review["changes"] == changes
    changed = plan.effective_config(cfg)
    assert (
        changed.prompt.sampling == {"temperature": 1.1, "max_tokens": 8}
        and changed.prompt.system == "Be brief."
    )
    assert cfg.prompt.sampling["temperature"] == 0.7  # run.json's settings stay as they were
    shard = plan.shards[0]
    before, after = job_spec(cfg, "infer_judge", 1, shard), job_spec(changed, "infer_judge", 1, shard)
    assert after.params["sampling"]["temperature"] == 1.1 and after.job_id != before.job_id
    write_plan(RunLayout(cfg.run_root), plan)
    assert read_plan(RunLayout(cfg.run_root), "round-01") == plan  # config included, as tasks read it
    for s in plan.shards:
        finish_shard(changed, 1, s, {"r25"})
    summary = close_round(cfg, plan)  # close checks the jobs against the round's settings
    assert summary is not None and summary["approved"] == 1 and summary["invariant"]["ok"]
    nxt = propose_slot(cfg, "round-02").plan
    assert nxt.settings == changes  # a change holds until changed again
    with pytest.raises(ConfigError):  # a template the workers could not render is refused at the gate
        apply_choice(cfg, propose_slot(cfg, "round-02"), CONTINUE, changes={"prompt_template": "{{ question"})
    with pytest.raises(ConfigError, match="may change"):
        apply_choice(cfg, proposal, CONTINUE, changes={"judge": {"type": "llm"}})


def test_hybrid_switches_when_a_round_approves_too_little(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, strategy="hybrid", hybrid_min_shrink=0.5)
    fake_round(cfg, "round-00", {"r00", "r01"})
    plan = propose_slot(cfg, "round-01").plan
    assert plan.mode == "skip" and plan.switch_in_place and "switching to in place" in plan.reason
    write_plan(RunLayout(cfg.run_root), plan)
    assert propose_slot(cfg, "tail").plan.mode == "in_place"


def test_close_quarantines_shards_without_a_manifest(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    good, bad = plan.shards[0], plan.shards[1]
    finish_shard(cfg, 0, good, {f"r{i:02d}" for i in range(5)})
    record_job_error(cfg, 0, bad.shard_id, "infer_judge", "disk full", None)
    summary = close_round(cfg, plan)
    assert summary is not None
    failed = {f["shard_id"]: f for f in summary["failed_shards"]}
    assert set(failed) == {bad.shard_id, plan.shards[2].shard_id}
    assert failed[bad.shard_id]["error"] == "disk full" and failed[bad.shard_id]["phase"] == "infer_judge"
    assert "no completion manifest" in failed[plan.shards[2].shard_id]["error"]
    assert summary["invariant"] == {
        "planned": 30, "accounted": 30, "ok": True, "lost": [], "doubled": [], "unexpected": [], "opened": [],
    }  # fmt: skip
    assert (summary["approved"], summary["rejected"]) == (5, 5)
    assert (Path(RunLayout(cfg.run_root).failed(0)) / f"{bad.shard_id}.json").exists()


def test_job_ids_name_the_run_and_change_with_the_request(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    shard = propose_slot(cfg, "round-00").plan.shards[0]
    a = job_spec(cfg, "infer", 0, shard)
    assert a.job_id == job_spec(cfg, "infer", 0, shard).job_id
    cfg = cfg.replace(sampling={"temperature": 0.1})
    assert job_spec(cfg, "infer", 0, shard).job_id != a.job_id
    other = RunConfig.of(**{**cfg.to_dict(), "run_root": str(tmp_path / "other")})
    assert job_spec(other, "infer", 0, shard).job_id.split("-")[0] != a.job_id.split("-")[0]


def test_params_at_their_defaults_stay_off_the_wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's params leave out those at their defaults (a new param changes no job id), but those
    every job carried before (prompt_template, system, sampling even when empty); the fingerprint
    version, bumped, changes every job id."""
    from airflow_batchinfer.rpc import fingerprint
    from airflow_batchinfer.state.params import JobParams

    assert JobParams().wire() == {} and JobParams(system=None, select="first_approved").wire() == {
        "system": None
    }
    cfg = make_run(tmp_path)
    shard = propose_slot(cfg, "round-00").plan.shards[0]
    spec = job_spec(cfg, "infer", 0, shard)
    assert {"prompt_template", "system", "sampling", "chunk_size", "id_field", "round"} <= set(spec.params)
    assert not {"select", "truncated", "adapters", "retry_sampling", "max_tokens_cap"} & set(spec.params)
    monkeypatch.setattr(fingerprint, "FINGERPRINT_VERSION", 2)
    assert job_spec(cfg, "infer", 0, shard).job_id != spec.job_id


def test_pinned_job_ids_follow_the_input_version(tmp_path: Path) -> None:
    from airflow_batchinfer.rpc.fingerprint import pin_input

    cfg = make_run(tmp_path)
    spec = job_spec(cfg, "judge", 0, propose_slot(cfg, "round-00").plan.shards[0])
    a = pin_input(spec, {"size": 10, "mtime": 1.0})
    assert a.job_id == pin_input(spec, {"size": 10, "mtime": 1.0}).job_id
    assert a.params["input_version"] == "10:1.0" and a.job_id.startswith(spec.job_id.rsplit("-", 1)[0])
    assert pin_input(spec, {"size": 10, "mtime": 2.0}).job_id != a.job_id  # rewritten input: a new job


def test_a_round_runs_one_fused_job_per_shard_or_two_with_a_judge_pool(tmp_path: Path) -> None:
    from airflow_batchinfer.run.jobs import job_spec, round_kinds

    base = {"input": "x.jsonl", "run_root": str(tmp_path / "run"), "prompt_template": "{{ q }}"}
    fused = RunConfig.of(**base, judge={"type": "llm"}, sampling={"max_tokens": 8})
    two = RunConfig.of(**base, judge={"type": "llm"}, judge_pool="local://judges")
    assert round_kinds(fused, "rounds") == ("infer_judge",)
    assert round_kinds(fused, "in_place") == ("in_place",)
    assert round_kinds(two, "rounds") == ("infer", "judge")
    empty = RunConfig.of(**base, judge={"type": "llm"}, judge_pool="")  # empty: no pool of its own
    assert empty.judging.judge_pool is None
    # the fused job carries both the generation and the judge settings, and writes approved/rejected
    spec = job_spec(
        fused, "infer_judge", 0, PlannedShard.of({"shard_id": "part-00000", "uri": "p.jsonl", "records": 3})
    )
    assert spec.params["sampling"] == {"max_tokens": 8} and spec.params["judge"] == {"type": "llm"}
    assert {"approved", "rejected", "staging", "manifest"} <= set(spec.outputs)
    assert "inferred" not in spec.outputs
    with pytest.raises(ConfigError, match=r"judge_pool 'local://judges' serves a judge model.*'regex'"):
        RunConfig.of(**base, judge={"type": "regex", "pattern": "x"}, judge_pool="local://judges")
