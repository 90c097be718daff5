"""Airflow orchestration benchmark (printed, not asserted), SIMULATED engine.

One run of the pipeline DAG on a real local Airflow (api-server, scheduler, dag-processor, triggerer;
SQLite, LocalExecutor) against a local pool of ``replicas × concurrency`` slots, and, side by side in
the same run, the same shards through ``batchinfer run``'s pipeline without Airflow on the same pool.

- Per-shard orchestration overhead: each mapped task's wall time (start to end, deferral included)
  minus its worker job's run time (from the completion manifest). Target: ≤ 5 s per shard.
- Pool-slot saturation in the steady state (from the first shard task's start until the last one
  started, i.e. while shards were still waiting for a slot): the share of slot-seconds held by shard
  tasks, and the share in which a worker was actually running the task's job. Target: ≥ 90 %.

Run: ``python bench/airflow_e2e.py [--shards 32 --job-seconds 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.airflow import DevAirflow  # noqa: E402
from airflow_batchinfer.pools import LocalPool, LocalPoolSpec  # noqa: E402
from airflow_batchinfer.rpc.pool import PoolClient  # noqa: E402
from airflow_batchinfer.run.pipeline import run_pipeline  # noqa: E402
from airflow_batchinfer.state.config import RunConfig  # noqa: E402

DAG = """
from airflow_batchinfer.dag_factory import build_batch_inference_dag
build_batch_inference_dag("bench", max_rounds=1, airflow_pool="bench", defaults={defaults!r},
                          poll_interval_s={poll})
"""


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def steady_saturation(
    spans: list[tuple[float, float, float, float]], slots: int
) -> tuple[float, float, float]:
    """``spans``: (task start, task end, job start, job end). Returns (held, working, window seconds)
    over the window in which shards still queued for a slot: [first task start, last task start]."""
    lo = min(s[0] for s in spans)
    hi = max(s[0] for s in spans)
    if hi <= lo:
        return 0.0, 0.0, 0.0
    held = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e, _, _ in spans)
    work = sum(max(0.0, min(je, hi) - max(js, lo)) for _, _, js, je in spans)
    window = (hi - lo) * slots
    return held / window, work / window, hi - lo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--records-per-shard", type=int, default=50)
    ap.add_argument("--job-seconds", type=float, default=4.0, help="simulated batch latency: about one job")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--poll", type=float, default=1.0, help="trigger poll interval (s)")
    args = ap.parse_args()
    slots = args.replicas * args.concurrency
    work = Path(tempfile.mkdtemp(prefix="bench-airflow-"))
    data = work / "data.jsonl"
    n = args.shards * args.records_per_shard
    data.write_text("".join(json.dumps({"id": f"r{i:06d}", "question": f"q {i}"}) + "\n" for i in range(n)))
    engine_options = {"approval_rate": 1.0, "latency_base_s": args.job_seconds}
    defaults = {
        "input": str(data), "output_root": str(work / "runs"), "run_name": "airflow", "engine": "simulated",
        "model": None, "engine_options": engine_options, "prompt_template": "{{ question }}",
        "judge": {"type": "length", "min_chars": 1}, "records_per_shard": args.records_per_shard,
        "chunk_size": args.records_per_shard, "worker_pool": "local://bench", "replicas": args.replicas,
        "concurrency": args.concurrency, "idle_ttl_s": 600, "preflight_records": 0,
        "target_batch_tokens": 10**6,
    }  # fmt: skip
    (work / "dags").mkdir()
    (work / "dags" / "bench.py").write_text(DAG.format(defaults=defaults, poll=args.poll))
    cache = work / "cache"
    env = {"BATCHINFER_CACHE": str(cache)}

    # 1. the same shards without Airflow, on the same kind of pool (warm), for scale
    import os

    os.environ["BATCHINFER_CACHE"] = str(cache)
    pool = LocalPool("bench")
    spec = LocalPoolSpec(engine="simulated", engine_options=engine_options, replicas=args.replicas,
                         concurrency=args.concurrency, idle_ttl_s=600, allowed_prefixes=(str(work / "runs"),),
                         target_batch_tokens=10**6)  # fmt: skip
    urls = pool.up(spec)
    cfg = RunConfig.of(input=str(data), run_root=str(work / "runs" / "direct"),
                       prompt_template="{{ question }}", judge={"type": "length", "min_chars": 1},
                       records_per_shard=args.records_per_shard, chunk_size=args.records_per_shard,
                       max_rounds=1)  # fmt: skip

    async def direct() -> float:
        client = PoolClient(urls, token=pool.token(), poll_interval_s=args.poll)
        t0 = time.monotonic()
        try:
            await run_pipeline(cfg, client)
        finally:
            await client.aclose()
        return time.monotonic() - t0

    direct_s = asyncio.run(direct())

    # 2. the DAG on a real Airflow
    af = DevAirflow(home=work / "airflow", dags_folder=work / "dags", parallelism=max(8, slots * 2), env=env)
    try:
        af.start(pools={"bench": slots})
        af.wait_for_dag("bench")
        t0 = time.monotonic()
        run_id = af.trigger("bench")
        state = af.wait_run("bench", run_id, timeout_s=3600)
        dag_s = time.monotonic() - t0
        tis = af.task_instances("bench", run_id)
    finally:
        af.stop()
        pool.down()
    root = work / "runs" / "airflow"
    plan = json.loads((root / "round-00" / "plan.json").read_text())
    rows: list[dict[str, Any]] = []
    spans: list[tuple[float, float, float, float]] = []
    for ti in tis:
        kind = ti["task_id"].rsplit(".", 1)[-1]
        if kind not in ("infer", "judge") or ti["map_index"] < 0 or not ti["end_date"]:
            continue
        sid = plan["shards"][ti["map_index"]]["shard_id"]
        manifest = json.loads((root / "round-00" / "jobs" / f"{sid}.{kind}.json").read_text())
        start, end = ts(ti["start_date"]), ts(ti["end_date"])
        job = float(manifest["timings"]["run_s"])
        rows.append({"kind": kind, "wall": end - start, "job": job, "overhead": end - start - job})
        timings = manifest["timings"]
        spans.append((start, end, float(timings["started_at"]), float(timings["finished_at"])))
    held, working, window = steady_saturation(spans, slots)
    print(f"Airflow e2e, SIMULATED engine: {args.shards} shards x {args.records_per_shard} records, pool of "
          f"{slots} slots ({args.replicas} workers x {args.concurrency}), ~{args.job_seconds} s per job, "
          f"trigger poll {args.poll} s; DAG run {state}")  # fmt: skip
    print(f"{'task':<8}{'n':>5}{'wall med':>10}{'job med':>10}{'overhead med':>14}{'p90':>8}{'max':>8}")
    result: dict[str, Any] = {"bench": "airflow_e2e", "shards": args.shards, "slots": slots, "state": state}
    for kind in ("infer", "judge"):
        sel = [r for r in rows if r["kind"] == kind]
        over = sorted(r["overhead"] for r in sel)
        med = statistics.median(over)
        p90 = over[int(0.9 * (len(over) - 1))]
        wall, job = statistics.median(r["wall"] for r in sel), statistics.median(r["job"] for r in sel)
        print(f"{kind:<8}{len(sel):>5}{wall:>10.2f}{job:>10.2f}{med:>14.2f}{p90:>8.2f}{over[-1]:>8.2f}")
        result[f"{kind}_overhead_median_s"] = round(med, 2)
        result[f"{kind}_overhead_p90_s"] = round(p90, 2)
    print(f"steady state ({window:.0f} s): slots held by shard tasks {held:.1%}; slots with a job running "
          f"{working:.1%}")  # fmt: skip
    print(f"whole round: DAG run {dag_s:.1f} s (all tasks, incl. shard/plan/close/report) vs the same "
          f"jobs without Airflow {direct_s:.1f} s: x{dag_s / direct_s:.2f}")  # fmt: skip
    result.update(saturation_held=round(held, 3), saturation_working=round(working, 3),
                  dag_run_s=round(dag_s, 1), direct_s=round(direct_s, 1))  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
