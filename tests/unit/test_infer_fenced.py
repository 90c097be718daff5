"""Issue 22, item 9 (a): a late copy of an infer job (a zombie attempt that finishes after its retry
and after the judge read the retry's output) changes neither what the judge read nor what close
accepts. Runs ``batchinfer run``'s own round code (:func:`airflow_batchinfer.run.pipeline.run_pipeline`)
on the worker's own job code with the SIMULATED engine; the late copy runs on a second "worker"
whose engine fails the first shard's records, so its output differs from the one the judge read."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.pipeline import run_pipeline
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    JobManifest,
    read_accepted,
    read_job_manifest,
    read_plan,
    read_summary,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime
from tests.support.fake_jobs import IDS, read_rows

pytestmark = pytest.mark.chaos
LATE = "part-00000"  # the shard whose infer job has a late copy


async def run_on_worker(spec: JobSpec, **engine: Any) -> JobManifest:
    """``spec`` on a fresh in-process worker (its registry and job code); returns its manifest."""
    runtime = Runtime(create_engine("simulated", latency_base_s=0.0, **engine), batch_timeout_s=0.001)
    await runtime.start()
    try:
        registry = JobRegistry(runtime, concurrency=2, worker_name="w")
        pinned = pin_input(spec, JsonlFile(spec.input).info())
        registry.submit(pinned, parse_params(spec.kind, pinned.params))
        task = registry.jobs[pinned.job_id].task
        assert task is not None
        await task
        status = registry.status(pinned.job_id)
        assert status is not None and status.state == "succeeded", status
        manifest = read_job_manifest(spec.outputs["manifest"])
        assert manifest is not None
        return manifest
    finally:
        await runtime.close()


class Pool:
    """What ``run_pipeline`` needs of a pool client. After the judge of ``LATE``, the zombie copy of
    that shard's infer job finishes on another worker (same job id and input, its own attempt)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.judge_read: str | None = None

    async def engine(self) -> dict[str, Any]:
        return create_engine("simulated").describe()  # what each worker reports (fail_marker aside)

    async def refresh(
        self, *, force: bool = False
    ) -> None:  # one worker of two slots (run.pipeline.pool_slots)
        self.clients = {"w1": self}

    async def stats(self) -> SimpleNamespace:
        return SimpleNamespace(slots_total=2)

    async def run(self, spec: JobSpec) -> JobManifest:
        manifest = await run_on_worker(spec)
        if spec.kind == "judge" and f"-{LATE}-" in spec.job_id:
            self.judge_read = spec.input
            plan = read_plan(RunLayout(self.cfg.run_root), "round-00")
            assert plan is not None
            [shard] = [s for s in plan.shards if s.shard_id == LATE]
            assert plan.config is not None  # the settings the round ran (run.json's: its id field found)
            late = job_spec(plan.config, "infer", 0, shard)  # the same job as the one the judge read
            await run_on_worker(late, fail_marker="q r0")  # its rows differ: r00..r09 fail
        return manifest


def test_a_late_infer_copy_changes_neither_the_judge_input_nor_the_accepted_attempt(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": f"q {i}"}) + "\n" for i in IDS))
    cfg = RunConfig.of(
        input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ question }}",
        records_per_shard=10, judge={"type": "llm"}, judge_pool="local://judge", max_rounds=1,
        strategy="rounds", lanes=3,  # lanes set: this fake pool answers no /v1/stats
    )  # fmt: skip
    layout = RunLayout(cfg.run_root)
    pool = Pool(cfg)
    asyncio.run(run_pipeline(cfg, pool, judge_pool=pool))  # type: ignore[arg-type]
    plan = read_plan(layout, "round-00")
    assert plan is not None and plan.mode == "rounds"
    summary = read_summary(layout, 0)
    assert summary is not None and summary.failed_shards == [], summary.failed_shards
    assert summary.invariant.ok, summary.invariant

    # the late copy's manifest names its own attempt; the judge read the one before it
    late = read_job_manifest(layout.job_manifest(0, LATE, "infer"))
    assert late is not None and late.committed is not None and late.counts.generated.error == 10
    assert pool.judge_read is not None and pool.judge_read != late.committed["inferred"]
    judge = read_accepted(layout.accepted(0, LATE, "judge"))
    infer = read_accepted(layout.accepted(0, LATE, "infer"))
    assert isinstance(judge, AcceptedJob) and judge.input == pool.judge_read
    assert isinstance(infer, AcceptedJob) and infer.committed == {"inferred": pool.judge_read}
    assert infer.attempt != late.attempt and infer.manifest_attempt == late.attempt

    # inferred/ holds what the judge read: every row answered, as in its approved + rejected rows
    inferred = read_rows(layout.inferred(0, LATE))
    assert [r["status"] for r in inferred] == ["ok"] * 10
    judged = read_rows(layout.result(0, LATE)) + read_rows(layout.rejected(0, LATE))
    assert sorted((r["id"], r["result"]) for r in judged) == sorted((r["id"], r["result"]) for r in inferred)
    assert not Path(layout.staged_job(0, LATE, "infer")).exists()  # the late attempt is never promoted

    # the id invariant, counted from the files: each id once in results/ or the next pending set
    seen = [r["id"] for f in JsonlDir(layout.results).jsonl_files() for r in f.iter_records()]
    seen += [r["id"] for f in JsonlDir(layout.pending(1)).jsonl_files() for r in f.iter_records()]
    assert Counter(seen) == Counter(IDS)
