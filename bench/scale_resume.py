"""Part (d) of ``bench/scale.py``: resume inside a shard (issue 24 item 1), SIMULATED engine.

One shard job of ``--records`` records (default 200,000; ``--quick``: 20,000) of 50–400 tokens on one
simulated worker (the latency model of part (a): ``a + b·prompt tokens`` per batch, one batch at a
time), in ``--chunk-size`` chunks (2,000):

1. undisturbed, with ``outputs["segments"]`` (each chunk committed as a segment, the output assembled
   from them at the end);
2. undisturbed, without (the old behaviour: one streamed file);
3. with segments, the worker SIGKILLed once the job's progress passes half the shard, a new worker
   started, the same job resubmitted: it resumes after the committed segments;
4. the same kill without segments: the new worker computes the whole shard again.

Printed: the wall of each (for 3 and 4: until the kill, and the resubmitted job's), the records the
new worker inferred after the kill (its batcher's completed requests) in 3 vs 4, and the segments'
overhead, 1 vs 2. Standalone: ``python bench/scale_resume.py [--quick] [--records N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.workers import WorkerProcess, start_worker  # noqa: E402
from airflow_batchinfer.rpc.models import JobSpec  # noqa: E402
from airflow_batchinfer.state.docs import read_job_manifest  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from airflow_batchinfer.storage.shard_ref import ShardRef  # noqa: E402
from bench.scale import PROMPT, make_dataset  # noqa: E402

DEFAULT_RECORDS = 200_000
QUICK_RECORDS = 20_000


def _spec(work: Path, shard: ShardRef, tag: str, *, segments: bool, chunk_size: int) -> JobSpec:
    layout = RunLayout(str(work / f"run-{tag}"))
    sid = shard.shard_id
    outputs = {
        "inferred": layout.inferred(0, sid),
        "manifest": layout.job_manifest(0, sid, "infer"),
        "staging": layout.staging(0),
    }
    if segments:
        outputs["segments"] = layout.segments(0, sid, "infer")
    return JobSpec(
        job_id=f"resume-{tag}-{sid}",
        kind="infer",
        input=shard.uri,
        outputs=outputs,
        params={
            "prompt_template": PROMPT,
            "chat": False,
            "input_records": shard.records,
            "sampling": {"max_tokens": 1},
            "chunk_size": chunk_size,
        },
    )


def _worker(args: argparse.Namespace, work: Path) -> WorkerProcess:
    flags = ["--target-batch-tokens", str(args.target_batch_tokens), "--max-batch-size"]
    flags += [str(args.max_batch_size), "--max-concurrent-batches", "1"]
    engine = {"latency_base_s": args.a, "latency_per_token_s": args.b, "completion_tokens": 0}
    return start_worker(work / "workers", concurrency=1, engine_args=engine, extra=flags, allow=[str(work)])


def _completed(w: WorkerProcess) -> int:
    return int(w.http("GET", "/v1/stats").json()["batcher"]["total_completed"])


def _run(w: WorkerProcess, spec: JobSpec) -> float:
    t0 = time.perf_counter()
    status = w.wait(w.submit(spec).job_id, timeout=7200, poll_s=0.05)
    if status.state != "succeeded":
        raise RuntimeError(f"{spec.job_id} {status.state}: {status.error}\n{w.log_tail()}")
    return time.perf_counter() - t0


def _undisturbed(args: argparse.Namespace, work: Path, shard: ShardRef, *, segments: bool) -> dict[str, Any]:
    tag = "d1" if segments else "d2"
    spec = _spec(work, shard, tag, segments=segments, chunk_size=args.chunk_size)
    w = _worker(args, work)
    try:
        wall = _run(w, spec)
    finally:
        w.stop()
    m = read_job_manifest(spec.outputs["manifest"])
    assert m is not None
    return {"wall_s": round(wall, 2), "counts": m.counts.model_dump(mode="json")}


def _killed(args: argparse.Namespace, work: Path, shard: ShardRef, *, segments: bool) -> dict[str, Any]:
    """The job until its progress passes half the shard, the worker SIGKILLed, then resubmitted to a
    new worker (same job id)."""
    tag = "d3" if segments else "d4"
    spec = _spec(work, shard, tag, segments=segments, chunk_size=args.chunk_size)
    half = shard.records // 2
    first = _worker(args, work)
    try:
        t0 = time.perf_counter()
        first.submit(spec)
        while (status := first.status(spec.job_id)).progress.done < half:
            if status.state != "running":
                raise RuntimeError(f"{spec.job_id} ended before the kill: {status.state}")
            time.sleep(0.02)
        done_at_kill = status.progress.done
        inferred_before = _completed(first)
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait()
        to_kill = time.perf_counter() - t0
    finally:
        first.stop()
    second = _worker(args, work)
    try:
        after = _run(second, spec)
        recomputed = _completed(second)
    finally:
        second.stop()
    m = read_job_manifest(spec.outputs["manifest"])
    assert m is not None
    return {
        "to_kill_s": round(to_kill, 2),
        "resubmitted_wall_s": round(after, 2),
        "wall_s": round(to_kill + after, 2),
        "done_at_kill": done_at_kill,
        "inferred_before_kill": inferred_before,  # at least (read just before the kill)
        "recomputed_after_kill": recomputed,
        "resumed_records": m.counts.resume.records,
        "counts": m.counts.model_dump(mode="json"),
    }


def part_d(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Resume inside a shard: one shard job undisturbed and killed halfway, with and without segments."""
    records = getattr(args, "resume_records", None) or args.records
    # scale.py's arguments have no --chunk-size: the worker's default chunk then
    args = argparse.Namespace(**{**vars(args), "chunk_size": getattr(args, "chunk_size", None) or 2_000})
    d_work = work / "resume"
    d_work.mkdir(parents=True, exist_ok=True)
    (shard,), total_tokens = make_dataset(d_work, records, 1, getattr(args, "seed", 0))
    r: dict[str, Any] = {
        "records": shard.records,
        "total_tokens": total_tokens,
        "chunk_size": args.chunk_size,
    }
    r["segments"] = _undisturbed(args, d_work, shard, segments=True)
    r["plain"] = _undisturbed(args, d_work, shard, segments=False)
    r["killed_segments"] = _killed(args, d_work, shard, segments=True)
    r["killed_plain"] = _killed(args, d_work, shard, segments=False)
    r["overhead"] = round(r["segments"]["wall_s"] / r["plain"]["wall_s"] - 1, 4)
    return r


def print_d(r: dict[str, Any]) -> None:
    print(
        f"\n== (d) resume inside a shard, SIMULATED engine: one shard job of {r['records']:,} records "
        f"({r['total_tokens']:,} tokens), chunks of {r['chunk_size']:,}, one worker =="
    )
    ks, kp = r["killed_segments"], r["killed_plain"]
    rows = [
        ("(1) segments", f"{r['segments']['wall_s']} s"),
        ("(2) no segments", f"{r['plain']['wall_s']} s (the old behaviour)"),
        ("segments overhead", f"{r['overhead'] * 100:+.1f} % ((1) vs (2))"),
        (
            "(3) killed, segments",
            f"{ks['wall_s']} s = {ks['to_kill_s']} s to the kill (progress {ks['done_at_kill']:,}) + "
            f"{ks['resubmitted_wall_s']} s resubmitted",
        ),
        (
            "(4) killed, no segm.",
            f"{kp['wall_s']} s = {kp['to_kill_s']} s to the kill (progress {kp['done_at_kill']:,}) + "
            f"{kp['resubmitted_wall_s']} s resubmitted",
        ),
        (
            "recomputed after kill",
            f"{ks['recomputed_after_kill']:,} (3, resumed {ks['resumed_records']:,}) vs "
            f"{kp['recomputed_after_kill']:,} (4)",
        ),
        (
            "lost at the kill",
            f"{ks['inferred_before_kill'] - ks['resumed_records']:,}+ records inferred but not committed (3)",
        ),
    ]
    for k, v in rows:
        print(f"{k:>22}: {v}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RECORDS:,} records")
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--chunk-size", type=int, default=2_000)
    parser.add_argument("--target-batch-tokens", type=int, default=32_000)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--a", type=float, default=0.005, help="engine latency per batch, s")
    parser.add_argument("--b", type=float, default=2e-6, help="engine latency per prompt token, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.records = QUICK_RECORDS
    work = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        r = part_d(args, work)
        print_d(r)
        print(f"{'load avg':>22}: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(json.dumps({"bench": "scale_resume", "resume": r}))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
