"""Fenced job outputs with real storage and real workers (issue 11): close accepts one attempt per
shard, once, on local disk and on S3; two live copies of one job; a drained job is retryable."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import job_spec, judge_input
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import AcceptedJob, read_accepted, read_job_manifest, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.storage.location import resolve
from airflow_batchinfer.worker.registry import DRAINED
from tests.support.fake_jobs import counted, finish_job, finish_shard, judge_shard, read_rows, write_rows
from tests.support.roots import Root
from tests.support.workers import start_worker

pytestmark = pytest.mark.slow
IDS = [f"r{i:02d}" for i in range(30)]


def make_run(tmp_path: Path, run_root: str, so: dict[str, Any] | None = None) -> RunConfig:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"{i}"}) + "\n" for i in IDS))
    cfg = RunConfig.of(
        input=str(data),
        run_root=run_root,
        prompt_template="{{ q }}",
        judge={"type": "llm"},
        records_per_shard=10,
        judge_pool="local://judge",  # two jobs per shard (infer, then judge): the judge's copies race
    )
    layout = RunLayout(run_root)
    cfg = cfg.replace(
        id_field=shard_dataset(
            cfg.data.input, layout.input, records_per_shard=10, storage_options=so
        ).id_field,
    )
    return cfg


def ids_in(uri: str, so: dict[str, Any] | None = None) -> list[str]:
    return [r["id"] for f in JsonlDir(uri, storage_options=so).jsonl_files() for r in f.iter_records()]


def each_id_once(cfg: RunConfig, summary: dict[str, Any], so: dict[str, Any] | None = None) -> bool:
    layout = RunLayout(cfg.run_root)
    seen = ids_in(layout.results, so) + ids_in(layout.pending(summary["round"] + 1), so)
    for f in summary["failed_shards"]:
        seen += [r["id"] for r in read_rows(f["uri"], so)]
    return bool(summary["invariant"]["ok"]) and Counter(seen) == Counter(IDS)


def exists(uri: str, so: dict[str, Any] | None) -> bool:
    loc = resolve(uri, so)
    loc.fs.invalidate_cache()
    return bool(loc.fs.exists(loc.path))


def test_close_quarantines_then_accepts_a_late_copy_once(tmp_path: Path, root: Root) -> None:
    so = root.storage_options
    cfg = make_run(tmp_path, root.uri("run"), so)
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00", so).plan
    write_plan(layout, plan, so)
    s, rest = plan.shards[0], plan.shards[1:]
    sid = s.shard_id
    for x in rest:
        finish_shard(cfg, 0, x, {i for i in IDS if int(i[1:]) % 2 == 0}, so=so)
    rows = [{**r, "result": "x", "status": "ok"} for r in read_rows(s.uri, so)]
    finish_job(cfg, "infer", 0, s, {"inferred": rows}, counted(ok=10), so=so)
    write_rows(layout.rejected(0, sid), rows[:3], so)  # a judge that died between its two commits

    first = close_round(cfg, plan, so)
    assert first is not None and [f["shard_id"] for f in first["failed_shards"]] == [sid]
    assert first["failed_shards"][0]["orphans_removed"] == [layout.rejected(0, sid)]
    assert not exists(layout.rejected(0, sid), so) and each_id_once(cfg, first, so)
    results = sorted(ids_in(layout.results, so))

    # two copies of the judge job finish after close: staged only, nothing doubled
    judge_shard(cfg, 0, s, {"r00"}, token="a", so=so)
    judge_shard(cfg, 0, s, {"r01", "r02"}, token="b", so=so)
    assert sorted(ids_in(layout.results, so)) == results and each_id_once(cfg, first, so)

    second = close_round(cfg, plan, so)  # the re-run: the manifest names attempt b
    assert second is not None and second["failed_shards"] == [] and each_id_once(cfg, second, so)
    assert sorted(r["id"] for r in read_rows(layout.result(0, sid), so)) == ["r01", "r02"]
    assert not exists(f"{layout.failed(0)}/{sid}.json", so)
    assert not exists(f"{layout.staged_job(0, sid, 'judge')}/a/approved.jsonl.zst", so)
    doc = read_accepted(layout.accepted(0, sid, "judge"), so)
    assert isinstance(doc, AcceptedJob) and doc.attempt == "b"
    assert doc.counts.model_dump() == {"outcomes": {"approved": 2, "rejected": 8}}

    judge_shard(cfg, 0, s, {"r00"}, token="c", so=so)  # yet another copy: never replaces b
    third = close_round(cfg, plan, so)
    assert third is not None and third["approved"] == second["approved"] and each_id_once(cfg, third, so)
    assert sorted(r["id"] for r in read_rows(layout.result(0, sid), so)) == ["r01", "r02"]


def test_two_live_copies_on_real_workers_promote_one_attempt(tmp_path: Path) -> None:
    """An Airflow retry submits the same job to a second worker while the first still runs; the two
    judges disagree (approval rates differ). Close promotes both files of one attempt only."""
    cfg = make_run(tmp_path, str(tmp_path / "run"))
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(layout, plan)
    workers = [
        start_worker(tmp_path, engine_args={"approval_rate": rate, "latency_base_s": 0.02})
        for rate in (0.2, 0.8)
    ]
    try:

        def pinned(kind: str, shard: Any) -> JobSpec:
            spec = job_spec(cfg, kind, 0, judge_input(cfg, 0, shard) if kind == "judge" else shard)  # type: ignore[arg-type]
            return pin_input(spec, JsonlFile(spec.input).info())

        for s in plan.shards:
            spec = pinned("infer", s)
            assert workers[0].wait(workers[0].submit(spec).job_id).state == "succeeded"
        specs = [pinned("judge", s) for s in plan.shards]
        for spec in specs:
            for w in workers:  # both copies run at once
                w.submit(spec)
        for spec in specs:
            for w in workers:
                status = w.wait(spec.job_id)
                assert status.state == "succeeded", status
    finally:
        for w in workers:
            w.stop()
    manifests = [read_job_manifest(layout.job_manifest(0, s.shard_id, "judge")) for s in plan.shards]
    for s in plan.shards:  # two attempts staged per shard, neither final yet
        assert len(list(Path(layout.staged_job(0, s.shard_id, "judge")).iterdir())) == 2
        assert not Path(layout.result(0, s.shard_id)).exists()
    summary = close_round(cfg, plan)
    assert summary is not None and summary["failed_shards"] == [] and each_id_once(cfg, summary)
    for s, m in zip(plan.shards, manifests, strict=True):
        assert m is not None
        doc = read_accepted(layout.accepted(0, s.shard_id, "judge"))
        assert isinstance(doc, AcceptedJob) and doc.attempt == m.attempt and doc.counts == m.counts
        approved = read_rows(layout.result(0, s.shard_id))
        rejected = read_rows(layout.rejected(0, s.shard_id))
        assert (len(approved), len(rejected)) == (m.counts.outcomes.approved, m.counts.outcomes.rejected)
        assert not Path(layout.staged_job(0, s.shard_id, "judge")).exists()


def test_a_job_cancelled_by_drain_is_retryable_over_http(tmp_path: Path) -> None:
    """SIGTERM past the drain timeout: the job ends cancelled with ``retryable``, and the worker exits 0.

    The worker answers for only a moment between cancelling its jobs and closing its socket, so
    several clients poll; the in-process app test (tests/unit/worker/test_registry.py) checks the same
    answer deterministically."""
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"{i}"}) + "\n" for i in range(20)))
    layout = RunLayout(str(tmp_path / "run"))
    s = shard_dataset(str(src), layout.input).shards[0]
    sid = s.shard_id
    spec = JobSpec(
        job_id="drained-1",
        kind="in_place",
        input=s.uri,
        outputs={
            "approved": layout.result(0, sid, tail=True),
            "rejected": layout.rejected(0, sid),
            "checkpoints": layout.checkpoints(0, sid),
            "manifest": layout.job_manifest(0, sid, "in_place"),
            "staging": layout.staging(0),
        },
        params={"prompt_template": "{{ q }}", "judge": {"type": "llm"}, "max_attempts": 100_000},
    )
    w = start_worker(
        tmp_path, engine_args={"approval_rate": 0.0, "latency_base_s": 0.01}, extra=["--drain-timeout", "1"]
    )
    w.submit(spec)
    headers = {"Authorization": f"Bearer {w.token}"}
    seen: list[dict[str, Any]] = []
    gone = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=w.url, headers=headers, timeout=5) as client:
            while not gone.is_set():
                try:
                    seen.append(client.get(f"/v1/jobs/{spec.job_id}").json())
                except httpx.HTTPError:
                    return

    deadline = time.monotonic() + 30
    while w.status(spec.job_id).counts.outcomes.attempts < 20:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pollers = [threading.Thread(target=poll) for _ in range(3)]
    for t in pollers:
        t.start()
    assert w.stop(signal.SIGTERM) == 0
    gone.set()
    for t in pollers:
        t.join()
    assert seen and all(x["state"] in ("running", "cancelled") for x in seen)
    for x in seen:
        if x["state"] == "cancelled":
            assert (x["retryable"], x["error"]) == (True, DRAINED)
        else:
            assert (x["retryable"], x["error"]) == (False, None)
    assert f"job {spec.job_id} (in_place, input {s.uri}) cancelled: {DRAINED}" in w.log_tail()
    assert not Path(spec.outputs["rejected"]).exists() and read_job_manifest(spec.outputs["manifest"]) is None
