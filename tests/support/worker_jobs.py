"""Shard jobs run by the worker's own registry and job code in the test's process (SIMULATED engine,
or a scoring model at the engine seam: :class:`HashScoringEngine`), for tests of what the workers
write without an HTTP server."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.engines.base import Engine, GenerationRequest, GenerationResult
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult, ScoringModel
from airflow_batchinfer.engines.simulated import stable_fraction
from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.models import JobKind, JobStatus
from airflow_batchinfer.run.jobs import job_spec, judge_input
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime


def run_jobs(
    cfg: RunConfig,
    jobs: list[tuple[JobKind, int, ShardRef | RangeRef | PlannedShard]],
    *,
    serving: Engine | None = None,
    **engine: Any,
) -> list[JobStatus]:
    """Run ``(kind, round, shard)`` jobs one after the other; each must succeed. ``engine``: the
    SIMULATED engine's options (no latency unless given); ``serving``: another engine the worker
    serves instead (a judge pool's scoring model, say)."""

    async def main() -> list[JobStatus]:
        engine.setdefault("latency_base_s", 0.0)
        runtime = Runtime(serving or create_engine("simulated", **engine), batch_timeout_s=0.001)
        await runtime.start()
        registry = JobRegistry(runtime, concurrency=4, worker_name="w1")
        out = []
        try:
            for kind, r, ref in jobs:
                shard = PlannedShard.of(ref)
                src = judge_input(cfg, r, shard) if kind == "judge" else shard
                spec = job_spec(cfg, kind, r, src)
                pinned = pin_input(spec, JsonlFile(spec.input).info())
                registry.submit(pinned, parse_params(kind, pinned.params))
                task = registry.jobs[pinned.job_id].task
                assert task is not None
                await task
                status = registry.status(pinned.job_id)
                assert status is not None and status.state == "succeeded", status
                out.append(status)
        finally:
            await runtime.close()
        return out

    return asyncio.run(main())


class HashScoringEngine(Engine):
    """A scoring model at the engine seam, for judge jobs of ``reward`` and ``classifier`` judges
    without torch (the real ones: tests/component/test_model_judges.py): each text's outputs are
    deterministic in its request id, ``lo`` to ``hi`` (one label: a reward head's raw score; two: a
    binary classifier's logits, ``rejected`` then ``approved``)."""

    name = "hash-scoring"

    def __init__(self, labels: tuple[str, ...] = ("reward",), lo: float = -5.0, hi: float = 5.0) -> None:
        self.scoring = ScoringModel("/models/hash-scoring", labels)
        self.lo, self.hi = lo, hi

    def output(self, request_id: str) -> tuple[float, ...]:
        x = self.lo + (self.hi - self.lo) * stable_fraction("score", request_id)
        return (x,) if len(self.scoring.labels) == 1 else (-x / 2, x / 2)

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult.failed("a scoring model generates nothing") for _ in requests]

    async def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        return [ScoreResult(self.output(r.request_id), prompt_tokens=r.estimate_tokens()) for r in requests]

    def describe(self) -> dict[str, Any]:
        assert self.scoring is not None
        return {"engine": self.name, "model": "hash-scoring", **self.scoring.describe()}
