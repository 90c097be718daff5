"""Closing a round accepts each shard's outputs once (issue 11): fenced, staged job outputs; stale
manifests; orphans; late and duplicate copies; re-runs of close. Real files on local disk; jobs are
finished as a worker would (tests.support.fake_jobs) or by the worker's own job code in-process."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import inferred_shard, job_spec, record_job_error
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import AcceptedJob, Plan, QuarantinedJob, read_accepted, read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.storage.shard_ref import ShardRef
from tests.support.fake_jobs import (
    ENGINE,
    IDS,
    close,
    counted,
    finish_job,
    finish_shard,
    judge_shard,
    plan_round,
    write_rows,
)
from tests.support.fake_jobs import make_run as make_fused_run
from tests.support.worker_jobs import run_jobs


def make_run(tmp_path: Path, **settings: Any) -> RunConfig:
    """Rounds of two jobs per shard (infer, then judge on the judge's own pool): close checks both.
    The fused infer_judge round is closed in test_accounting and by the pipeline tests."""
    return make_fused_run(tmp_path, judge_pool="local://judge", **settings)


def ids_in(directory: str) -> list[str]:
    return [r["id"] for f in JsonlDir(directory).jsonl_files() for r in f.iter_records()]


def where(cfg: RunConfig, summary: dict[str, Any]) -> Counter[str]:
    """How often each input id is in results, the next pending set or a quarantined shard."""
    layout = RunLayout(cfg.run_root)
    seen = ids_in(layout.results) + ids_in(layout.pending(summary["round"] + 1))
    for f in summary["failed_shards"]:
        seen += [r["id"] for r in JsonlFile(f["uri"]).iter_records()]
    return Counter(seen)


def assert_each_id_once(cfg: RunConfig, summary: dict[str, Any]) -> None:
    assert summary["invariant"]["ok"], summary["invariant"]
    assert where(cfg, summary) == Counter(IDS)


def snapshot(*dirs: str) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for d in dirs if Path(d).is_dir() for p in sorted(Path(d).iterdir())}


def half(shard: ShardRef) -> set[str]:
    return {r["id"] for r in JsonlFile(shard.uri).iter_records() if int(r["id"][1:]) % 2 == 0}


# ------------------------------------------------------------------------------------ fencing
def test_judge_outputs_are_staged_and_close_promotes_them(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    s = plan.shards[0]
    spec = job_spec(cfg, "judge", 0, inferred_shard(cfg, 0, s))
    assert spec.outputs["staging"] == layout.staging(0) == f"{cfg.run_root}/round-00/staged"
    assert job_spec(cfg, "infer", 0, s).outputs["staging"] == layout.staging(0)  # infer: fenced too
    manifests = [finish_shard(cfg, 0, x, half(x), token=f"t{i}") for i, x in enumerate(plan.shards)]
    m = manifests[0]
    assert m.committed == {
        n: f"{cfg.run_root}/round-00/staged/{s.shard_id}.judge/t0/{n}.jsonl.zst"
        for n in ("approved", "rejected")
    }
    assert not Path(layout.result(0, s.shard_id)).exists()  # nothing final before close

    summary = close(cfg, plan)
    assert (summary["approved"], summary["rejected"], summary["next_pending"]) == (15, 15, 15)
    assert_each_id_once(cfg, summary)
    accepted = read_accepted(layout.accepted(0, s.shard_id, "judge"))
    assert isinstance(accepted, AcceptedJob) and accepted.attempt == "t0" and not accepted.quarantined
    assert accepted.counts == counted(approved=5, rejected=5) and accepted.job_id == m.job_id
    assert accepted.outputs == {"approved": spec.outputs["approved"], "rejected": spec.outputs["rejected"]}
    assert not Path(layout.staging(0), f"{s.shard_id}.judge").exists()  # promoted, nothing left
    assert sorted(ids_in(layout.results)) == sorted(i for x in plan.shards for i in half(x))

    # a re-run of close changes nothing (the accepted docs are not rewritten)
    before = {p: p.stat().st_mtime_ns for p in Path(layout.round(0), "jobs").glob("*.json")}
    again = close(cfg, plan)
    assert {p: p.stat().st_mtime_ns for p in Path(layout.round(0), "jobs").glob("*.json")} == before
    assert again["approved"] == 15 and again["failed_shards"] == []


# ---------------------------------------------------------------------------------- staleness
@pytest.mark.parametrize("closed_before", [False, True])
def test_stale_manifest_after_a_judge_change_quarantines_the_shard(
    tmp_path: Path, closed_before: bool
) -> None:
    """Resume with a changed judge whose new job failed: the old manifest is not counted."""
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for x in plan.shards:
        finish_shard(cfg, 0, x, half(x))
    if closed_before:
        assert close(cfg, plan)["approved"] == 15
    # the resumed run's settings, another judge, and its round's
    cfg = cfg.replace(judge={"type": "llm", "max_tokens": 64})
    plan = plan.model_copy(update={"config": cfg})
    bad, rest = plan.shards[0], plan.shards[1:]
    for x in rest:  # the new judge jobs succeed for these shards...
        judge_shard(cfg, 0, x, {r["id"] for r in JsonlFile(x.uri).iter_records()})
    record_job_error(cfg, 0, bad.shard_id, "judge", "JobFailed: boom", None)  # ...and fail for this one

    summary = close(cfg, plan)
    [failed] = summary["failed_shards"]
    manifest = layout.job_manifest(0, bad.shard_id, "judge")
    assert failed["shard_id"] == bad.shard_id and failed["phase"] == "judge"
    assert failed["error"].startswith(f"{manifest} was written under other settings or for another input")
    assert (
        "re-run the DAG run to recompute it" in failed["error"]
        and "last error: JobFailed: boom" in failed["error"]
    )
    assert (summary["approved"], summary["rejected"]) == (20, 0)
    assert_each_id_once(cfg, summary)
    assert not Path(layout.result(0, bad.shard_id)).exists()
    assert not Path(layout.rejected(0, bad.shard_id)).exists()
    assert bool(failed["orphans_removed"]) == closed_before  # the old acceptance's outputs
    # the stale attempt's files are gone; the current infer attempt (not yet accepted) stays for the
    # judge's re-run to read, and once accepted before, inferred/ holds it instead
    infer = read_job_manifest(layout.job_manifest(0, bad.shard_id, "infer"))
    assert infer is not None
    assert infer.committed is not None
    left = [] if closed_before else [Path(infer.committed["inferred"])]
    assert list(Path(layout.staging(0)).rglob("*.zst")) == left
    doc = read_accepted(layout.accepted(0, bad.shard_id, "judge"))
    assert isinstance(doc, QuarantinedJob) and doc.quarantined and doc.phase == "judge"


def test_a_rewritten_input_makes_the_judge_manifest_stale(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    for x in plan.shards:
        finish_shard(cfg, 0, x, half(x))
    s = plan.shards[1]
    rows = [{**r, "result": "other", "status": "ok"} for r in JsonlFile(s.uri).iter_records()]
    judged = read_job_manifest(RunLayout(cfg.run_root).job_manifest(0, s.shard_id, "judge"))
    assert judged is not None and "/staged/" in judged.input  # the infer attempt it read
    time.sleep(0.01)  # a new mtime on every file system
    write_rows(judged.input, rows)  # that attempt rewritten under the judge (by hand)
    summary = close(cfg, plan)
    assert [f["shard_id"] for f in summary["failed_shards"]] == [s.shard_id]
    assert "another input version" in summary["failed_shards"][0]["error"]
    assert_each_id_once(cfg, summary)


def test_resume_with_changed_settings_accepts_the_new_job(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for x in plan.shards:
        finish_shard(cfg, 0, x, half(x), token="old")
    assert close(cfg, plan)["approved"] == 15
    cfg = cfg.replace(judge={"type": "llm", "max_tokens": 64})  # and its round's
    plan = plan.model_copy(update={"config": cfg})
    for x in plan.shards:
        judge_shard(cfg, 0, x, {r["id"] for r in JsonlFile(x.uri).iter_records()}, token="new")
    summary = close(cfg, plan)
    assert (summary["approved"], summary["rejected"], summary["next_pending"]) == (30, 0, 0)
    assert_each_id_once(cfg, summary)
    doc = read_accepted(layout.accepted(0, plan.shards[0].shard_id, "judge"))
    assert isinstance(doc, AcceptedJob) and doc.attempt == "new"


# ------------------------------------------------------------------------------------ orphans
def test_orphan_rejected_file_of_a_judge_that_died_is_removed(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    dead, rest = plan.shards[0], plan.shards[1:]
    for x in rest:
        finish_shard(cfg, 0, x, half(x))
    rows = [{**r, "result": "x", "status": "ok"} for r in JsonlFile(dead.uri).iter_records()]
    finish_job(cfg, "infer", 0, dead, {"inferred": rows}, counted(ok=10))
    orphan = layout.rejected(0, dead.shard_id)  # committed by the judge before it died: no manifest
    write_rows(orphan, rows[:4])

    summary = close(cfg, plan)
    [failed] = summary["failed_shards"]
    assert failed["shard_id"] == dead.shard_id and failed["phase"] == "judge"
    assert failed["orphans_removed"] == [orphan] and orphan in failed["error"]
    assert not Path(orphan).exists() and summary["orphans_removed"] == [orphan]
    assert (summary["rejected"], summary["next_pending"]) == (10, 10)
    assert_each_id_once(cfg, summary)
    record = json.loads(Path(layout.failed(0), f"{dead.shard_id}.json").read_text())
    assert record["orphans_removed"] == [orphan] and "re-run the DAG run" in record["remedy"]


def test_outputs_of_shards_the_plan_does_not_name_are_removed(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for x in plan.shards:
        finish_shard(cfg, 0, x, half(x))
    stray = [layout.rejected(0, "part-00099"), layout.result(0, "part-00099")]
    for uri in stray:
        write_rows(uri, [{"id": "zz"}])
    summary = close(cfg, plan)
    assert sorted(summary["orphans_removed"]) == sorted(stray)
    assert_each_id_once(cfg, summary)


# -------------------------------------------------------------------------- late and double copies
def test_late_copy_after_quarantine_changes_nothing_until_close_runs_again(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    late, rest = plan.shards[2], plan.shards[:2]
    for x in rest:
        finish_shard(cfg, 0, x, half(x))
    rows = [{**r, "result": "x", "status": "ok"} for r in JsonlFile(late.uri).iter_records()]
    finish_job(cfg, "infer", 0, late, {"inferred": rows}, counted(ok=10))
    first = close(cfg, plan)
    assert [f["shard_id"] for f in first["failed_shards"]] == [late.shard_id]
    assert_each_id_once(cfg, first)
    finals = snapshot(layout.results, layout.rejected_dir(0), layout.pending(1))

    judge_shard(cfg, 0, late, half(late), token="late")  # the Airflow retry's copy finishes after close
    assert snapshot(layout.results, layout.rejected_dir(0), layout.pending(1)) == finals
    assert where(cfg, first) == Counter(IDS)  # nothing doubled: its rows are only staged

    second = close(cfg, plan)  # the documented remedy: re-run the DAG run (its close)
    assert second["failed_shards"] == [] and (second["approved"], second["rejected"]) == (15, 15)
    assert_each_id_once(cfg, second)
    assert not Path(layout.failed(0), f"{late.shard_id}.json").exists()
    doc = read_accepted(layout.accepted(0, late.shard_id, "judge"))
    assert isinstance(doc, AcceptedJob) and doc.attempt == "late" and not doc.quarantined


def test_two_copies_close_promotes_the_attempt_its_manifest_names_once(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for x in plan.shards[1:]:
        finish_shard(cfg, 0, x, half(x))
    s = plan.shards[0]
    sid = s.shard_id
    evens, firsts = half(s), {"r00", "r01", "r02"}
    finish_shard(cfg, 0, s, evens, token="a")  # copy A commits first...
    judge_shard(
        cfg, 0, s, firsts, token="b"
    )  # ...then copy B (a nondeterministic judge) overwrites the manifest
    summary = close(cfg, plan)
    doc = read_accepted(layout.accepted(0, sid, "judge"))
    assert isinstance(doc, AcceptedJob) and doc.attempt == "b"
    assert doc.counts == counted(approved=3, rejected=7)
    assert {
        r["id"] for r in JsonlFile(layout.result(0, sid)).iter_records()
    } == firsts  # B's two files, not mixed
    assert {r["id"] for r in JsonlFile(layout.rejected(0, sid)).iter_records()} == {
        r for r in IDS[:10]
    } - firsts
    assert not Path(layout.staged_job(0, sid, "judge")).exists()  # A's attempt is deleted, never promoted
    assert_each_id_once(cfg, summary)

    judge_shard(cfg, 0, s, evens, token="a")  # A's manifest lands late, still valid for these settings
    again = close(cfg, plan)
    doc = read_accepted(layout.accepted(0, sid, "judge"))
    assert isinstance(doc, AcceptedJob) and doc.attempt == "b"  # the accepted copy stays
    assert {r["id"] for r in JsonlFile(layout.result(0, sid)).iter_records()} == firsts
    assert again["approved"] == summary["approved"]  # counts from the accepted doc, not the manifest
    assert not Path(layout.staged_job(0, sid, "judge")).exists()
    assert_each_id_once(cfg, again)


def test_close_cut_short_mid_promotion_finishes_the_accepted_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import airflow_batchinfer.run.settle as settle

    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for x in plan.shards:
        finish_shard(cfg, 0, x, half(x), token="t1")
    move, moved = settle.files.move, list[str]()

    def crash_after_one(src: str, dst: str, so: Any) -> None:
        if moved:
            raise OSError("killed")
        moved.append(src)
        move(src, dst, so)

    monkeypatch.setattr(settle.files, "move", crash_after_one)
    with pytest.raises(OSError, match="killed"):
        close_round(cfg, Plan(slot=plan.slot, round=0, mode="rounds", shards=plan.shards[:1]))
    monkeypatch.setattr(settle.files, "move", move)
    sid = plan.shards[0].shard_id
    judge_shard(cfg, 0, plan.shards[0], set(), token="t2")  # another copy lands before the re-run
    summary = close(cfg, plan)
    doc = read_accepted(layout.accepted(0, sid, "judge"))
    assert isinstance(doc, AcceptedJob) and doc.attempt == "t1"
    assert summary["approved"] == 15 and summary["failed_shards"] == []
    assert_each_id_once(cfg, summary)


def test_a_valid_manifest_whose_staged_outputs_are_gone_is_quarantined_for_recompute(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for x in plan.shards:
        m = finish_shard(cfg, 0, x, half(x))
    assert m.committed is not None
    Path(m.committed["approved"]).unlink()
    summary = close(cfg, plan)
    [failed] = summary["failed_shards"]
    assert failed["shard_id"] == plan.shards[-1].shard_id and "staged outputs of attempt" in failed["error"]
    assert read_job_manifest(layout.job_manifest(0, failed["shard_id"], "judge")) is None  # so it reruns
    assert_each_id_once(cfg, summary)


# ------------------------------------------------------------------ the worker's own job code
def test_worker_rounds_jobs_stage_their_outputs_and_close_accepts_them(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    run_jobs(cfg, [(k, 0, s) for k in ("infer", "judge") for s in plan.shards], approval_rate=0.5)
    sid = plan.shards[0].shard_id
    m = read_job_manifest(layout.job_manifest(0, sid, "judge"))
    assert m is not None and m.attempt is not None and len(m.attempt) == 32
    staged = Path(layout.staged_job(0, sid, "judge"), m.attempt)
    assert m.committed == {n: str(staged / f"{n}.jsonl.zst") for n in ("approved", "rejected")}
    assert m.outputs["approved"] == layout.result(0, sid) and not Path(layout.results).exists()
    summary = close(cfg, plan)
    assert summary["approved"] + summary["rejected"] == 30 and 0 < summary["approved"] < 30
    assert summary["workers"]["w1"]["jobs"] == 6
    assert_each_id_once(cfg, summary)
    # the worker's digests agree with its files: close read none of them to check the ids
    assert summary["invariant"]["opened"] == [] and set(m.ids or {}) == {"input", "approved", "rejected"}
    infer = read_job_manifest(layout.job_manifest(0, sid, "infer"))
    assert infer is not None and infer.ids is not None
    planned = plan.shards[0].to_json()["ids"]
    assert infer.ids["input"].model_dump() == infer.ids["inferred"].model_dump() == planned


def test_worker_in_place_copies_share_checkpoints_and_close_counts_the_accepted_one(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, strategy="in_place", max_attempts=3)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg, "tail")
    assert plan.mode == "in_place"
    [first] = run_jobs(cfg, [("in_place", 0, s) for s in plan.shards], approval_rate=0.5)[:1]
    sid = plan.shards[0].shard_id
    m = read_job_manifest(layout.job_manifest(0, sid, "in_place"))
    assert m is not None and set(m.committed or {}) == {"approved", "rejected"}
    assert not Path(layout.result(0, sid, tail=True)).exists()
    summary = close(cfg, plan)
    assert summary["approved"] + summary["exhausted"] == 30 and summary["invariant"]["ok"]
    assert summary["invariant"]["opened"] == []
    assert m.digest("input") == plan.shards[0].ref.ids
    accepted = read_accepted(layout.accepted(0, sid, "in_place"))
    assert isinstance(accepted, AcceptedJob) and accepted.attempt == m.attempt
    assert accepted.counts == first.counts

    tail_ids = ids_in(layout.results) + ids_in(layout.rejected_dir(0))
    assert Counter(tail_ids) == Counter(IDS)

    # a second copy of one job (an Airflow retry) finishes later with other verdicts: not counted
    run_jobs(cfg, [("in_place", 0, plan.shards[0])], approval_rate=0.1)
    m2 = read_job_manifest(layout.job_manifest(0, sid, "in_place"))
    assert m2 is not None and m2.attempt != m.attempt and m2.job_id == m.job_id
    again = close(cfg, plan)
    assert again["approved"] == summary["approved"] and again["exhausted"] == summary["exhausted"]
    assert Counter(ids_in(layout.results) + ids_in(layout.rejected_dir(0))) == Counter(IDS)


@pytest.mark.parametrize("model", ["simulated", "another-model"])
def test_close_counts_only_jobs_of_the_engine_the_plan_recorded(tmp_path: Path, model: str) -> None:
    """A resume on another model whose new jobs failed: the old model's manifests are not counted."""
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    for x in plan.shards:
        finish_shard(cfg, 0, x, half(x))  # run by ENGINE (model "simulated")
    plan.engine = {**ENGINE, "model": model}  # what the round's pool runs, as the plan task recorded it
    summary = close(cfg, plan)
    failed = summary["failed_shards"]
    if model == "simulated":
        assert failed == [] and summary["approved"] == 15
    else:
        assert len(failed) == len(plan.shards) and summary["approved"] == 0
        assert all("was written under other settings" in f["error"] for f in failed)
    assert_each_id_once(cfg, summary)
