"""Throughput at 100M scale (issue 12), SIMULATED engine: printed, not asserted.

The workload: ``--gpus`` simulated GPUs (one worker process each, one engine batch at a time:
``--max-concurrent-batches 1``), batch latency ``a + b·prompt tokens`` (a = 5 ms, b = 2 µs/token;
the engine's ``completion_tokens`` is 0, so its latency is exactly that), ``--records`` records of
50–400 tokens (seeded, uniform; a record's text has ``(tokens - 1) · 4`` characters, so
``chars // 4 + 1`` gives its tokens back), ``--target-batch-tokens`` 32,000, ``--max-batch-size``
256. The ideal bound is ``(ceil(total_tokens / target) · a + b · total_tokens) / GPUs``: every batch
full, every engine busy from the first second to the last; efficiency (the pool level) = bound /
wall. Each request's batch cost is its prompt tokens plus its completion budget (``max_tokens`` = 1),
so the worker's batches hold one token per record less prompt than the bound assumes (< 0.5 %).

Parts (each prints a table; one JSON line at the end holds them all):

(a) warm pool: the dataset sharded into ``--shards`` shards (the storage API), ``--gpus`` workers
    already up, the shard jobs submitted over the RPC (``PoolClient``, no Airflow) all at once.
    Printed: wall (client-observed, and first job start to last job end from the completion
    manifests), bound, efficiency, engine busy fraction per worker (batcher ``busy_time_s`` / wall),
    batches vs the ideal count, and the workers' peak RSS.

(b) the factory DAG on a real local Airflow 3.3.2 (api-server, scheduler, dag-processor, triggerer;
    SQLite, LocalExecutor; ``bench/scale_dag.py``): the same records as ONE plain JSONL file, the DAG
    of ``build_batch_inference_dag`` (simulated engine with the same latency model, a rule judge
    (``length``), one round, ``--records-per-shard`` 10,000: 1M records = 100 shards), an Airflow
    pool of ``--gpus × --dag-concurrency`` slots with ``include_deferred``, the local warm pool up
    beforehand with the spec ``pool_setup`` asks for; trigger → success over the REST API, sharding
    included. Printed: wall, bound, efficiency, engine busy fraction and batches (the workers'
    ``/v1/stats``), per task type (the task id's last part) durations, queue waits, deferrals
    (trigger logs) and peak RSS of its task processes (psutil, every ``--sample-s``), per shard-job
    task the overhead (task duration minus its job's ``run_s`` from the job manifests), the workers'
    peak RSS, and the CPU seconds of the scheduler, dag-processor, triggerer and api-server.
    ``--shards-per-round 1000`` makes small shards: a round of 1,000 mapped shards (issue 12 item 6,
    the default ``max_map_length`` is 1024).

(c) many small shards (issue 24): part (b) with ``--c-records-per-shard`` 20 (100k records = 5,000
    shards, the seed's shard count), one round, warm pool. Printed: wall, bound, efficiency, the
    Airflow CPU seconds (scheduler, dag-processor, triggerer, api-server, task processes) in all and
    per shard, the mapped tasks of the round (a round mapped per lane: ``lanes`` tasks; per shard:
    one per shard, at most ``max_map_length``), and the tail: from the first lane that ran out of
    shards to the round's last job end (the lane documents ``round-00/lanes/lane-*.json``).

(d) resume inside a shard (issue 24; ``bench/scale_resume.py``): one shard job of ``--resume-records``
    records (default 200,000) on one simulated worker, undisturbed and with the worker SIGKILLed
    halfway (a new worker started, the job resubmitted), each with chunk segments and without (the
    old behaviour). Printed: the walls, the records recomputed after the kill, the segments' overhead.

(e) side by side with Ray Data (issue 24), one run: the same records through Ray Data
    (``bench/scale_ray.py`` in ``.cache/ray-venv``, ``make ray-venv``: ``read_json`` →
    ``map_batches`` on an actor pool of ``--gpus`` actors, each batch call sleeping the same ``a +
    b·prompt tokens`` → ``write_json``; ``ray.init`` and the actors' start inside the clock) and
    through part (b)'s DAG with a COLD pool (no worker before the trigger: ``pool_setup`` starts
    them, inside the clock). Ray's ``batch_size`` is ``--target-batch-tokens`` / the dataset's mean
    tokens per record (32,000 / ~225 = 142 records), so its batches hold about the workers' budget.
    Printed: wall, bound, efficiency of both, their ratio, and the DAG's phases (shard, pool_setup,
    plan, the lanes, close, report: first start → last end from the trigger).

Targets (issue 12): pool ≥ 0.95; DAG ≥ 0.85 at 1M and ≥ 0.75 at 100k; every Airflow task ≤ 300 MB.
Issue 24: the DAG with a cold pool at least as fast as Ray Data at 100k; ≥ 0.95 of the bound at 1M.
The machine is shared: the load average is printed next to the figures.

Run: ``python bench/scale.py [--quick] [--records 1000000] [--parts a b c d e] [--shards-per-round 1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.workers import TOKEN, WorkerProcess, start_worker  # noqa: E402
from airflow_batchinfer.rpc.models import JobSpec  # noqa: E402
from airflow_batchinfer.rpc.pool import PoolClient  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from airflow_batchinfer.storage import JsonlDir  # noqa: E402
from airflow_batchinfer.storage.shard_ref import ShardRef  # noqa: E402

WORDS = ["sun", "haze", "dust", "cloud", "evening", "scatter", "light", "blue", "red", "angle", "air",
         "ocean", "wave", "salt", "wind"]  # fmt: skip
PROMPT = "{{ text }}"  # the prompt is the record's text: its tokens are the record's tokens


# ------------------------------------------------------------------------------------- dataset
def make_dataset(
    root: Path, records: int, shards: int, seed: int, *, sharded: bool = True, single: Path | None = None
) -> tuple[list[ShardRef], int]:
    """``records`` records of 50–400 tokens: in ``shards`` shards under ``root/input`` (``sharded``,
    for part (a)) and/or as ONE plain JSONL file ``single`` (part (b)), in one pass; returns the
    shards and the total tokens."""
    rng = random.Random(seed)
    corpus = " ".join(rng.choices(WORDS, k=400_000))  # text to slice from: a realistic ~3x compression
    lengths = [rng.randint(50, 400) for _ in range(records)]
    total_tokens = sum(lengths)

    def rows() -> Any:
        for i, tokens in enumerate(lengths):
            chars = (tokens - 1) * 4
            start = rng.randrange(len(corpus) - chars)
            yield {"id": i, "text": corpus[start : start + chars]}

    out = single.open("w") if single is not None else None
    try:
        if not sharded:
            assert out is not None
            for row in rows():
                out.write(json.dumps(row) + "\n")
            return [], total_tokens

        def tee() -> Any:
            for row in rows():
                if out is not None:
                    out.write(json.dumps(row) + "\n")
                yield row

        per_shard = math.ceil(records / shards)
        with JsonlDir(str(root / "input")).writer_sync(max_records_per_shard=per_shard) as w:
            w.write_many(tee())
        return list(w.shards_written), total_tokens
    finally:
        if out is not None:
            out.close()


def ideal_bound(total_tokens: int, target: int, a: float, b: float, gpus: int) -> tuple[float, int]:
    batches = math.ceil(total_tokens / target)
    return (batches * a + b * total_tokens) / gpus, batches


# ---------------------------------------------------------------------------------------- helpers
def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def batcher_stats(workers: list[WorkerProcess]) -> list[dict[str, Any]]:
    return [w.http("GET", "/v1/stats").json()["batcher"] for w in workers]


def infer_spec(layout: RunLayout, shard: ShardRef, tag: str) -> JobSpec:
    job = f"{tag}-{shard.shard_id}"
    return JobSpec(
        job_id=job,
        kind="infer",
        input=shard.uri,
        outputs={"inferred": layout.inferred(0, job), "manifest": layout.job_manifest(0, job, "infer")},
        params={
            "prompt_template": PROMPT,
            "chat": False,
            "input_records": shard.records,
            "sampling": {"max_tokens": 1},
        },
    )


# ------------------------------------------------------------------------------ (a) warm pool
async def submit_all(urls: list[str], specs: list[JobSpec], poll_s: float) -> list[dict[str, Any]]:
    client = PoolClient(urls, token=TOKEN, poll_interval_s=poll_s)
    try:
        return list(await asyncio.gather(*(client.run(s) for s in specs)))
    finally:
        await client.aclose()


def part_a(args: argparse.Namespace, work: Path, shards: list[ShardRef], total_tokens: int) -> dict[str, Any]:
    """Warm pool: ``--gpus`` workers up, the shard jobs over the RPC, no Airflow."""
    concurrency = math.ceil(len(shards) / args.gpus)  # every shard job runs at once
    flags = ["--target-batch-tokens", str(args.target_batch_tokens), "--max-batch-size"]
    flags += [str(args.max_batch_size), "--max-concurrent-batches", "1"]  # one batch at a time per GPU
    engine = {
        "latency_base_s": args.a,
        "latency_per_token_s": args.b,
        "completion_tokens": 0,  # latency = a + b·prompt tokens, exactly the model
    }
    workers = [
        start_worker(work, concurrency=concurrency, engine_args=engine, extra=flags) for _ in range(args.gpus)
    ]
    layout = RunLayout(str(work / "run"))
    try:
        before = batcher_stats(workers)
        t0, epoch0 = time.perf_counter(), time.time()
        manifests = asyncio.run(
            submit_all([w.url for w in workers], [infer_spec(layout, s, "a") for s in shards], args.poll)
        )
        wall, epoch1 = time.perf_counter() - t0, time.time()
        after = batcher_stats(workers)
        rss = [round(peak_rss_mb(w.process.pid), 1) for w in workers]
    finally:
        for w in workers:
            w.stop()
    bound, ideal_batches = ideal_bound(total_tokens, args.target_batch_tokens, args.a, args.b, args.gpus)
    starts = [m.timings.started_at for m in manifests]
    ends = [m.timings.finished_at for m in manifests]
    span = max(ends) - min(starts)
    busy = [x["busy_time_s"] - y["busy_time_s"] for x, y in zip(after, before, strict=True)]
    batches = sum(x["total_batches"] - y["total_batches"] for x, y in zip(after, before, strict=True))
    counts = [m.counts for m in manifests]
    return {
        "records": sum(s.records for s in shards),
        "shards": len(shards),
        "gpus": args.gpus,
        "total_tokens": total_tokens,
        "wall_s": round(wall, 2),
        "jobs_span_s": round(span, 2),
        "jobs_start_spread_s": round(max(starts) - min(starts), 2),
        "to_first_start_s": round(min(starts) - epoch0, 2),
        "after_last_end_s": round(epoch1 - max(ends), 2),
        "poll_s": args.poll,
        "bound_s": round(bound, 2),
        "efficiency": round(bound / wall, 3),
        "efficiency_jobs_span": round(bound / span, 3),
        "engine_busy_fraction": [round(b / wall, 3) for b in busy],
        "batches": batches,
        "ideal_batches": ideal_batches,
        "peak_rss_mb": rss,
        "ok": sum(c.generated.ok for c in counts),
        "errors": sum(c.generated.error for c in counts),
    }


def print_a(r: dict[str, Any]) -> None:
    print(
        f"\n== (a) warm pool, SIMULATED engine: {r['records']:,} records, {r['shards']} shard jobs over the "
        f"RPC on {r['gpus']} workers (no Airflow) =="
    )
    rows = [
        ("wall (client)", f"{r['wall_s']} s"),
        ("wall (jobs span)", f"{r['jobs_span_s']} s (first job start to last job end)"),
        (
            "client overhead",
            f"{r['to_first_start_s']} s to the first start, {r['after_last_end_s']} s after "
            f"the last end (poll {r['poll_s']} s); starts spread {r['jobs_start_spread_s']} s",
        ),
        ("ideal bound", f"{r['bound_s']} s"),
        ("efficiency", f"{r['efficiency']}  (jobs span: {r['efficiency_jobs_span']})"),
        ("engine busy / wall", ", ".join(map(str, r["engine_busy_fraction"]))),
        ("batches / ideal", f"{r['batches']} / {r['ideal_batches']}"),
        ("peak RSS", ", ".join(f"{m} MB" for m in r["peak_rss_mb"])),
        ("rows ok / error", f"{r['ok']:,} / {r['errors']:,}"),
    ]
    for k, v in rows:
        print(f"{k:>20}: {v}")


# ------------------------------------------------------------------------ (c) many small shards
def print_c(r: dict[str, Any]) -> None:
    from bench.scale_dag import print_timeline

    t = r["tail"]
    print(
        f"\n== (c) {r['shards']:,} shards of {r['records_per_shard']:,} records, one round, warm pool, "
        f"local Airflow, SIMULATED engine: run {r['state']} =="
    )
    lanes = (
        f"; {t['lanes']} lanes, {t['lanes_without_shards']} without a shard, shards per lane "
        f"{t['shards_per_lane_min_max']}, lanes' last ends spread {t['lane_ends_spread_s']} s"
        if t.get("source") == "lane documents"
        else ""
    )
    rows = [
        ("wall trigger->success", f"{r['wall_s']} s"),
        ("ideal bound", f"{r['bound_s']} s"),
        ("efficiency", f"{r['efficiency']}"),
        ("Airflow CPU", f"{r['airflow_cpu_s']} s in all, {r['airflow_cpu_ms_per_shard']} ms per shard"),
        ("mapped tasks", f"{r['mapped_tasks']:,} {r['mapped_by_type']}"),
        ("tail", f"{t.get('tail_s')} s (from the {t.get('source')}){lanes}"),
        ("load avg", f"{r['load_before']} before, {r['load_after']} after"),
    ]
    for k, v in rows:
        print(f"{k:>22}: {v}")
    print("\nCPU seconds over the run (own process / helper processes / task runners below it):")
    for comp, c in sorted(r["cpu_s"].items()):
        print(f"{comp:>22}: {c['own']} / {c['helpers']} / {c['tasks']}")
    print_timeline(r)


# ------------------------------------------------------------------- (e) Ray Data side by side
RAY_PYTHON = REPO / ".cache" / "ray-venv" / "bin" / "python"


def ray_batch_size(target_batch_tokens: int, total_tokens: int, records: int) -> int:
    """Records per Ray batch so a batch holds about the workers' token budget: Ray batches count
    records, the workers' batcher counts tokens."""
    return max(1, round(target_batch_tokens * records / total_tokens))


def part_ray(
    args: argparse.Namespace, work: Path, data: Path, total_tokens: int, bound: float
) -> dict[str, Any] | None:
    """The records through Ray Data (``bench/scale_ray.py`` in its own venv); ``None`` without it."""
    if not RAY_PYTHON.exists():
        print("Ray Data not installed: run make ray-venv")
        return None
    batch = ray_batch_size(args.target_batch_tokens, total_tokens, args.records)
    out = work / "ray-out"
    cmd = [str(RAY_PYTHON), str(REPO / "bench" / "scale_ray.py"), "--input", str(data), "--output", str(out)]
    cmd += ["--actors", str(args.gpus), "--batch-size", str(batch), "--a", str(args.a), "--b", str(args.b)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": ""}  # nothing of this venv's
    print(f"\n(e) Ray Data: {args.gpus} actors, batch_size {batch} records ...", flush=True)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.dag_timeout, check=False)
    outer = time.perf_counter() - t0
    load1 = os.getloadavg()
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"Ray Data run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return None
    r: dict[str, Any] = json.loads(lines[-1])
    shutil.rmtree(out, ignore_errors=True)
    r.update(
        bound_s=round(bound, 2),
        efficiency=round(bound / r["wall_s"], 3),
        process_s=round(outer, 2),
        load_before=[round(x, 2) for x in load0],
        load_after=[round(x, 2) for x in load1],
    )
    return r


def print_e(ray: dict[str, Any] | None, dag: dict[str, Any]) -> None:
    from bench.scale_dag import print_timeline

    print(
        f"\n== (e) side by side, SIMULATED engine: {dag['records']:,} records, {dag['gpus']} simulated "
        f"GPUs, bound {dag['bound_s']} s =="
    )
    head = f"{'':>34}{'wall s':>9}{'efficiency':>12}  load avg before / after"
    print(head)
    if ray is not None:
        print(
            f"{'Ray Data (init + actors inside)':>34}{ray['wall_s']:>9}{ray['efficiency']:>12}  "
            f"{ray['load_before']} / {ray['load_after']}"
        )
    print(
        f"{'DAG, cold pool (pool_setup)':>34}{dag['wall_s']:>9}{dag['efficiency']:>12}  "
        f"{dag['load_before']} / {dag['load_after']}"
    )
    if ray is not None:
        print(
            f"Ray Data: ray {ray['ray']}, {ray['actors']} actors, batch_size {ray['batch_size']}, "
            f"num_cpus {ray['num_cpus']}; ray.init {ray['init_s']} s (inside), import {ray['import_s']} s "
            f"and shutdown {ray['shutdown_s']} s (outside); {ray['rows_out']:,} rows written"
        )
        print(f"DAG wall / Ray Data wall: {dag['wall_s'] / ray['wall_s']:.2f}")
    print(
        f"DAG: {dag['shards']} shards (records_per_shard {dag['records_per_shard']:,}), "
        f"mapped tasks {dag['mapped_by_type']}, "
        f"batches {dag['batches']} / {dag['ideal_batches']}, engine busy / wall {dag['engine_busy_fraction']}"
    )
    print_timeline(dag)


# -------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 records (a fast look)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--parts", nargs="+", choices=["a", "b", "c", "d", "e"], default=["a", "b"])
    parser.add_argument("--shards", type=int, default=10, help="(a): shard jobs")
    parser.add_argument("--gpus", type=int, default=2, help="simulated GPUs: one worker process each")
    parser.add_argument("--target-batch-tokens", type=int, default=32_000)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--a", type=float, default=0.005, help="engine latency per batch, s")
    parser.add_argument("--b", type=float, default=2e-6, help="engine latency per prompt token, s")
    parser.add_argument(
        "--poll", type=float, default=0.25, help="(a): the client's status poll interval, s (default 0.25)"
    )
    parser.add_argument("--records-per-shard", type=int, default=10_000, help="(b): the DAG's shards")
    parser.add_argument(
        "--shards-per-round", type=int, default=None,
        help="(b): records per shard chosen to make this many shards (1000: item 6's 1,000-shard round)",
    )  # fmt: skip
    parser.add_argument("--c-records-per-shard", type=int, default=20, help="(c): the small shards' size")
    parser.add_argument("--cold", action="store_true", help="(b): no worker before the trigger")
    parser.add_argument("--dag-concurrency", type=int, default=5, help="(b): shard jobs per worker")
    parser.add_argument("--dag-parallelism", type=int, default=16, help="(b): LocalExecutor task slots")
    parser.add_argument("--dag-poll", type=float, default=2.0, help="(b): the shard triggers' poll, s")
    parser.add_argument("--dag-timeout", type=float, default=7200, help="(b): give up after, s")
    parser.add_argument("--preflight-records", type=int, default=200, help="(b): 0 skips the pre-flight")
    parser.add_argument("--sample-s", type=float, default=0.2, help="(b): RSS/CPU sampling interval")
    parser.add_argument("--resume-records", type=int, default=200_000, help="(d): the shard job's records")
    parser.add_argument("--chunk-size", type=int, default=2_000, help="(d): the job's chunk (and segment)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the dataset and outputs (temp dir)")
    args = parser.parse_args()
    if args.quick:
        args.records = 20_000
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        t0 = time.perf_counter()
        single = work / "data.jsonl" if {"b", "c", "e"} & set(args.parts) else None
        shards: list[Any] = []
        total_tokens = 0
        if {"a", "b", "c", "e"} & set(args.parts):  # (d) makes its own shard
            shards, total_tokens = make_dataset(
                work, args.records, args.shards, args.seed, sharded="a" in args.parts, single=single
            )
        print(f"dataset: {args.records:,} records, {total_tokens:,} tokens, {len(shards)} shards"
              f"{f', and one JSONL file of {single.stat().st_size / 2**20:.0f} MiB' if single else ''} "
              f"({time.perf_counter() - t0:.1f} s to generate) in {work}")  # fmt: skip
        result: dict[str, Any] = {"bench": "scale", "records": args.records, "seed": args.seed}

        if "a" in args.parts:
            result["warm_pool"] = a = part_a(args, work, shards, total_tokens)
            print_a(a)
            print(f"{'load avg':>20}: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

        bound, ideal_batches = ideal_bound(total_tokens, args.target_batch_tokens, args.a, args.b, args.gpus)
        if "b" in args.parts:
            from bench.scale_dag import part_b, print_b

            assert single is not None
            result["dag"] = b = part_b(
                args, work, single, total_tokens, args.records, bound, ideal_batches, cold=args.cold
            )
            print_b(b)

        if "c" in args.parts:
            from bench.scale_dag import part_b

            assert single is not None
            result["small_shards"] = c = part_b(
                args, work, single, total_tokens, args.records, bound, ideal_batches,
                records_per_shard=args.c_records_per_shard, name="c",
            )  # fmt: skip
            print_c(c)

        if "d" in args.parts:
            from bench.scale_resume import part_d, print_d

            result["resume"] = d = part_d(args, work)
            print_d(d)

        if "e" in args.parts:
            from bench.scale_dag import part_b

            assert single is not None
            ray = part_ray(args, work, single, total_tokens, bound)
            dag = part_b(
                args, work, single, total_tokens, args.records, bound, ideal_batches, cold=True, name="e"
            )
            result["side_by_side"] = {"ray_data": ray, "dag_cold": dag}
            print_e(ray, dag)

        print(json.dumps(result))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
