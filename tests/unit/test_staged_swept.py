"""Issue 22, item 9 (c): the staged outputs of a shard that stays quarantined are swept by every close
that quarantines it, except the attempt a current manifest names (an infer attempt its judge's
re-run reads); a job that finishes after that is still accepted by a later close."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_batchinfer.run import quarantine
from airflow_batchinfer.run.jobs import record_job_error, round_kinds
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    QuarantinedJob,
    read_accepted,
    read_job_manifest,
    write_accepted,
    write_doc,
)
from airflow_batchinfer.state.layout import RunLayout, staged_output
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.shard_ref import ShardRef
from tests.support.fake_jobs import (
    IDS,
    close,
    counted,
    finish_job,
    finish_shard,
    judge_shard,
    make_run,
    plan_round,
    read_rows,
    write_rows,
)

pytestmark = pytest.mark.chaos


def orphan_attempt(cfg: RunConfig, shard: ShardRef, kind: str, token: str) -> Path:
    """What a copy that died (or runs on, unreachable) left staged: its outputs, no manifest."""
    layout = RunLayout(cfg.run_root)
    names = ("inferred",) if kind == "infer" else ("approved", "rejected")
    for name in names:
        uri = staged_output(layout.staging(0), layout.job_manifest(0, shard.shard_id, kind), token, name)
        write_rows(uri, read_rows(shard.uri))
    return Path(layout.staged_job(0, shard.shard_id, kind), token)


def each_id_once(cfg: RunConfig, summary: dict[str, object]) -> None:
    layout = RunLayout(cfg.run_root)
    seen = [r["id"] for f in JsonlDir(layout.results).jsonl_files() for r in f.iter_records()]
    seen += [r["id"] for f in JsonlDir(layout.pending(1)).jsonl_files() for r in f.iter_records()]
    for failed in summary["failed_shards"]:  # type: ignore[attr-defined]
        seen += [r["id"] for r in read_rows(failed["uri"])]
    assert summary["invariant"]["ok"] and Counter(seen) == Counter(IDS)  # type: ignore[index]


def test_every_close_that_quarantines_a_shard_sweeps_its_staged_attempts(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)  # fused infer_judge jobs
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    s, rest = plan.shards[0], plan.shards[1:]
    sid, kind = s.shard_id, round_kinds(cfg, "rounds")[-1]
    for x in rest:
        finish_shard(cfg, 0, x, set())
    first = orphan_attempt(cfg, s, kind, "zombie")
    record_job_error(cfg, 0, sid, kind, "JobFailed: worker lost", None)

    summary = close(cfg, plan)
    assert [f["shard_id"] for f in summary["failed_shards"]] == [sid]
    assert not first.exists()  # swept with the quarantine
    quarantine = read_accepted(layout.accepted(0, sid, kind))
    assert isinstance(quarantine, QuarantinedJob) and quarantine.sweep == "swept"
    each_id_once(cfg, summary)

    second = orphan_attempt(cfg, s, kind, "zombie-2")  # another copy wrote after that close
    assert [f["shard_id"] for f in close(cfg, plan)["failed_shards"]] == [sid]
    assert not second.exists()  # the next close that finds it quarantined sweeps again

    judge_shard(cfg, 0, s, {"r00", "r01"}, token="late")  # the task's retry finishes at last
    summary = close(cfg, plan)
    assert summary["failed_shards"] == [] and not Path(layout.failed(0), f"{sid}.json").exists()
    doc = read_accepted(layout.accepted(0, sid, kind))
    assert isinstance(doc, AcceptedJob) and doc.attempt == "late"
    assert sorted(r["id"] for r in read_rows(layout.result(0, sid))) == ["r00", "r01"]
    assert not Path(layout.staged_job(0, sid, kind)).exists()
    each_id_once(cfg, summary)


def test_a_quarantined_shard_keeps_the_infer_attempt_its_judge_rerun_reads(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, judge_pool="local://judge")  # infer, then judge on its own pool
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    s, rest = plan.shards[0], plan.shards[1:]
    sid = s.shard_id
    for x in rest:
        finish_shard(cfg, 0, x, set())
    stray = orphan_attempt(cfg, s, "infer", "zombie")  # an infer copy that never wrote its manifest
    rows = [{**r, "result": "x", "status": "ok"} for r in read_rows(s.uri)]
    infer = finish_job(cfg, "infer", 0, s, {"inferred": rows}, counted(ok=10), token="current")
    assert infer.committed is not None
    attempt = s.with_ref(s.ref.model_copy(update={"uri": infer.committed["inferred"]}))
    judged = orphan_attempt(cfg, attempt, "judge", "zombie")
    record_job_error(cfg, 0, sid, "judge", "JobFailed: worker lost", None)

    summary = close(cfg, plan)
    assert [(f["shard_id"], f["phase"]) for f in summary["failed_shards"]] == [(sid, "judge")]
    assert not stray.exists() and not judged.exists()
    assert Path(infer.committed["inferred"]).exists()  # what the judge's re-run reads
    each_id_once(cfg, summary)

    manifest = judge_shard(cfg, 0, s, {"r05"}, token="rerun")
    assert manifest.input == infer.committed["inferred"] and manifest.committed is not None
    summary = close(cfg, plan)
    assert summary["failed_shards"] == []
    accepted = read_accepted(layout.accepted(0, sid, "infer"))
    assert isinstance(accepted, AcceptedJob) and accepted.attempt == "current"
    assert [r["result"] for r in read_rows(layout.inferred(0, sid))] == ["x"] * 10
    promoted = [Path(infer.committed["inferred"]).parent, Path(manifest.committed["approved"]).parent]
    assert not any(attempt.exists() for attempt in promoted)  # moved to their final URIs
    assert not any(Path(layout.staged_job(0, x.shard_id, kind)).exists()
                   for x in plan.shards for kind in ("infer", "judge"))  # fmt: skip  # no other attempt left
    assert read_job_manifest(layout.job_manifest(0, sid, "judge")) is not None
    each_id_once(cfg, summary)


def test_a_quarantine_cut_short_while_sweeping_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close that died between its quarantine's ``sweeping`` and ``swept`` never blocks the shard:
    a later close waits for that sweep until SWEEP_WAIT_S after it was decided, then takes the close
    for gone and decides again (here: accepts the job that finished since)."""
    monkeypatch.setattr(quarantine, "SWEEP_WAIT_S", 0.5)
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    s = plan.shards[0]
    sid, kind = s.shard_id, round_kinds(cfg, "rounds")[-1]
    for x in plan.shards[1:]:
        finish_shard(cfg, 0, x, set())
    judge_shard(cfg, 0, s, {"r01"}, token="late")
    dead = QuarantinedJob(shard_id=sid, kind=kind, sweep="sweeping", phase=kind,
                          error="JobFailed: worker lost", quarantined_at=time.time())  # fmt: skip
    write_accepted(layout.accepted(0, sid, kind), dead)
    write_doc(f"{layout.failed(0)}/{sid}.json", {"shard_id": sid, "uri": s.uri, "records": 10})

    started = time.monotonic()
    summary = close(cfg, plan)
    assert time.monotonic() - started >= 0.5  # it waited for the sweep first
    doc = read_accepted(layout.accepted(0, sid, kind))
    assert isinstance(doc, AcceptedJob) and not doc.quarantined and doc.attempt == "late"
    assert summary["failed_shards"] == [] and not Path(layout.failed(0), f"{sid}.json").exists()
    assert [r["id"] for r in read_rows(layout.result(0, sid))] == ["r01"]
    each_id_once(cfg, summary)
