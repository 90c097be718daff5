"""Shrink with the tail on a local pool: a round of 40 shards on 4 workers gives workers back as its
lanes end (idle ones stopped, never one with a job), and still accounts for every id once."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.pools.local_workers import alive
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.pipeline import RunLease, run_pipeline
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_plan
from airflow_batchinfer.state.docs.lanes import read_lanes
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir

pytestmark = pytest.mark.slow
LEASE = "dag/tail"


def uneven(tmp_path: Path) -> Path:
    """200 records, 5 a shard: each shard's prompts a length of their own (its latency), the last
    shard's far longer, so the lanes end one by one while it runs. Every line has the same size
    (``pad``, not prompted): the input's byte ranges cut it into 40 shards of 5."""
    src = tmp_path / "data.jsonl"
    rows = []
    for i in range(200):
        shard = i // 5
        question = " ".join(["word"] * (3000 if shard == 39 else 60 * (shard % 7 + 1)))
        rows.append(
            json.dumps({"id": f"r{i:04d}", "question": question, "pad": "x" * (15000 - len(question))})
        )
    src.write_text("\n".join(rows) + "\n")
    return src


class Sampler:
    """Samples the pool's live worker processes (and each live worker's job states) until stopped."""

    def __init__(self, pool: LocalPool) -> None:
        self.pool, self.token = pool, pool.token()
        self.samples: list[tuple[float, int]] = []  # (Unix time, live worker processes)
        self.jobs: dict[int, dict[str, int]] = {}  # pid -> the job states it last reported
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        import time

        while not self.stop.is_set():
            state = json.loads(self.pool.state_file.read_text())
            workers = [w for g in state["generations"].values() for w in g["workers"]]
            live = [w for w in workers if alive(int(w["pid"]))]
            self.samples.append((time.time(), len(live)))
            for w in live:
                if w.get("url"):
                    try:
                        with SyncWorkerClient(w["url"], token=self.token, timeout=2) as c:
                            self.jobs[int(w["pid"])] = c.stats().jobs
                    except Exception:
                        continue  # draining away
            self.stop.wait(0.05)


def test_a_round_gives_idle_workers_back_as_its_lanes_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))
    pool = LocalPool("tail", state_dir=tmp_path / "pools")
    spec = LocalPoolSpec(
        engine="simulated",
        replicas=4,
        concurrency=1,
        idle_ttl_s=None,
        engine_options={"approval_rate": 1.0, "latency_per_token_s": 2e-4},
        allowed_prefixes=(str(tmp_path),),
    )
    pool.start(spec, lease_id=LEASE, wait=True, timeout_s=120)
    cfg = RunConfig.of(
        input=str(uneven(tmp_path)), run_root=str(tmp_path / "run"), prompt_template="{{ question }}",
        judge={"type": "llm"}, max_rounds=1, records_per_shard=5, lanes=4, chunk_size=5,
    )  # fmt: skip
    sampler = Sampler(pool)

    async def go() -> dict[str, Any]:
        client = PoolClient.for_pool(pool, lease_id=LEASE, refresh_interval_s=0.5, poll_interval_s=0.1)
        try:
            return await run_pipeline(cfg, client, lease=RunLease(pool, LEASE))
        finally:
            await client.aclose()

    sampler.thread.start()
    try:
        with caplog.at_level(logging.INFO):
            summary = asyncio.run(go())
    finally:
        sampler.stop.set()
        sampler.thread.join()
        pool.down()

    layout = RunLayout(cfg.run_root)
    docs = read_lanes(layout, 0)
    plan = read_plan(layout, "round-00")
    assert plan is not None and len(plan.shards) >= 30  # ~40 (the input's byte ranges, estimated)
    assert sorted(s.shard_id for d in docs for s in d.shards) == sorted(s.shard_id for s in plan.shards)
    work_ended = max(s.ended_at or 0.0 for d in docs for s in d.shards)
    assert max(n for _, n in sampler.samples) == 4
    assert any(n < 4 for at, n in sampler.samples if at < work_ended), "no worker given back before the end"
    assert "lanes left" in caplog.text
    # no job was cancelled, failed or lost on the workers that stopped (nor on the others)
    states = {state for jobs in sampler.jobs.values() for state in jobs}
    assert states and states <= {"queued", "running", "succeeded"}, sampler.jobs
    assert not [r for r in caplog.records if "resubmitting" in r.message or "lost on" in r.message]
    assert summary["invariant"]["ok"], summary["invariant"]
    assert summary["failed_shards"] == [] and summary["approved"] == 200
    ids = [
        r["id"] for f in JsonlDir(str(tmp_path / "run" / "results")).jsonl_files() for r in f.iter_records()
    ]
    assert len(ids) == len(set(ids)) == 200
