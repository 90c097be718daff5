"""Batcher benchmarks (printed, not asserted).

1. Overhead per record, submit → resolved, against a bare ``asyncio.Queue`` + future round trip
   that batches the same way (target: batcher ≤ 2× bare).
2. A SIMULATED engine whose batch latency is ``a + b·tokens`` (a = 5 ms), fed by 10 concurrent
   producers with prompts of 50–400 tokens: utilization and average batch cost / target, across
   ``prefetch_batches`` × ``batch_timeout_s`` (targets: utilization ≥ 0.95, fill ≥ 0.90).

Run: ``make bench`` or ``python bench/batcher.py [--records N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from airflow_batchinfer.batching import DynamicBatcher, Prompt, TokenBatcher


async def bare_round_trip(n: int, batch: int) -> float:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue(maxsize=5_000)

    async def consumer() -> None:
        done = 0
        while done < n:
            items = [await q.get()]
            while len(items) < batch:
                try:
                    items.append(q.get_nowait())
                except asyncio.QueueEmpty:
                    break
            for record, fut in items:
                fut.set_result(record)
            done += len(items)

    task = loop.create_task(consumer())
    t0 = time.perf_counter()
    futs = []
    for i in range(n):
        fut = loop.create_future()
        await q.put((i, fut))
        futs.append(fut)
    await asyncio.gather(*futs)
    elapsed = time.perf_counter() - t0
    await task
    return elapsed


async def batcher_round_trip(n: int, batch: int) -> float:
    b: DynamicBatcher[int, int] = DynamicBatcher(
        lambda records: records, max_batch_size=batch, target_batch_cost=1e12, batch_timeout_s=0
    )
    async with b:
        t0 = time.perf_counter()
        futs = [await b.submit(i, estimated_cost=1) for i in range(n)]
        await asyncio.gather(*futs)
        return time.perf_counter() - t0


async def simulated_engine_run(
    *, prefetch: int, timeout: float, producers: int, per_producer: int, chunk: int, target: int, seed: int
) -> dict[str, Any]:
    a, b = 0.005, 2e-6  # SIMULATED engine: 5 ms + 2 µs per token

    async def engine(batch: list[Prompt]) -> list[int]:
        tokens = sum(p.estimate_tokens() for p in batch)
        await asyncio.sleep(a + b * tokens)
        return [p.estimate_tokens() for p in batch]

    rng = random.Random(seed)
    prompts = [
        [Prompt("x" * (4 * rng.randint(50, 400))) for _ in range(per_producer)] for _ in range(producers)
    ]
    batcher: TokenBatcher[Prompt, int] = TokenBatcher(
        engine,
        target_batch_tokens=target,
        max_batch_size=1024,
        prefetch_batches=prefetch,
        batch_timeout_s=timeout,
    )

    async def producer(mine: list[Prompt]) -> None:
        for i in range(0, len(mine), chunk):  # like a shard job: submit a chunk, await it, next chunk
            futs = [await batcher.submit(p) for p in mine[i : i + chunk]]
            await asyncio.gather(*futs)

    t0 = time.perf_counter()
    async with batcher:
        await asyncio.gather(*(producer(m) for m in prompts))
    wall = time.perf_counter() - t0
    s = batcher.stats
    return {
        "prefetch_batches": prefetch,
        "batch_timeout_s": timeout,
        "utilization": round(s.utilization, 4),
        "avg_fill": round(s.avg_fill, 4),
        "batches": s.total_batches,
        "avg_batch_size": round(s.avg_batch_size, 1),
        "closed_by": s.closed_by,
        "wall_s": round(wall, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records for the overhead test")
    parser.add_argument("--per-producer", type=int, default=2_000)
    args = parser.parse_args()

    batch = 256
    bare = min(asyncio.run(bare_round_trip(args.records, batch)) for _ in range(3))
    ours = min(asyncio.run(batcher_round_trip(args.records, batch)) for _ in range(3))
    overhead = {
        "records": args.records,
        "bare_us_per_record": round(bare / args.records * 1e6, 3),
        "batcher_us_per_record": round(ours / args.records * 1e6, 3),
        "ratio": round(ours / bare, 2),
    }
    print("\n== overhead per record (submit -> resolved), best of 3 ==")
    print(f"{'bare asyncio.Queue + future':32} {overhead['bare_us_per_record']:>8.2f} us")
    print(f"{'DynamicBatcher':32} {overhead['batcher_us_per_record']:>8.2f} us")
    print(f"{'ratio (target <= 2.0)':32} {overhead['ratio']:>8.2f}")

    grid = []
    for label, chunk in (
        ("saturated: chunks of 500 per producer", 500),
        ("lean: chunks of 10 per producer", 10),
    ):
        print("\n== SIMULATED engine (5 ms + 2 us/token), 10 producers, 50-400 token prompts, target 16k")
        print(f"== {label} ==")
        header = ("prefetch", "timeout_s", "util", "fill", "wall_s", "batches", "size")
        print(" ".join(f"{h:>9}" for h in header), " closed_by")
        for prefetch in (1, 2, 4):
            for timeout in (0.001, 0.01, 0.05):
                r = asyncio.run(
                    simulated_engine_run(
                        prefetch=prefetch,
                        timeout=timeout,
                        producers=10,
                        per_producer=args.per_producer,
                        chunk=chunk,
                        target=16_000,
                        seed=7,
                    )
                )
                grid.append({"chunk": chunk, **r})
                cells = (prefetch, timeout, r["utilization"], r["avg_fill"], r["wall_s"], r["batches"])
                print(" ".join(f"{c:>9}" for c in (*cells, r["avg_batch_size"])), "", r["closed_by"])
    print(json.dumps({"bench": "batcher", "overhead": overhead, "simulated_engine": grid}))


if __name__ == "__main__":
    main()
