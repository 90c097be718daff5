"""Planning a prefix of many small parts (printed, not asserted): issue 38's "listing a prefix of
100,000 objects must not be a bottleneck".

``--parts`` small JSONL parts (``--records`` records each) are written to local disk and to the S3
test server (SeaweedFS, started here with the tests' launcher ``tests/support/seaweedfs.py``; the
``dev`` extra's ``weed``). For each store, with its listing cache dropped first: listing
(:func:`~airflow_batchinfer.storage.input_parts.list_input`: one paginated listing, each part's
size and version from it) and planning
(:func:`~airflow_batchinfer.storage.part_plan.plan_parts`: small parts grouped whole, never opened;
one sample read), in seconds, with the bytes planning read, the shards and the stored size of the
plan's shard references (what ``input/_manifest.json`` holds).

Run: ``python bench/plan_parts.py --parts 10000``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' S3 launcher

from airflow_batchinfer.storage.input_parts import list_input
from airflow_batchinfer.storage.location import resolve
from airflow_batchinfer.storage.part_plan import plan_parts


def part(first: int, n: int) -> bytes:
    return b"".join(
        orjson.dumps({"id": f"q{i}", "prompt": "what is " + str(i)}) + b"\n" for i in range(first, first + n)
    )


def write(uri: str, so: dict[str, Any], parts: int, records: int) -> None:
    loc = resolve(uri, so)
    if loc.is_local:
        Path(loc.path).mkdir(parents=True, exist_ok=True)
    batch: dict[str, bytes] = {}
    for i in range(parts):
        batch[f"{loc.path}/part-{i:05d}.jsonl"] = part(i * records, records)
        if len(batch) == 1000 or i == parts - 1:
            loc.fs.pipe(batch)  # s3fs: concurrent puts
            batch = {}


def measure(store: str, uri: str, so: dict[str, Any], rps: int) -> dict[str, Any]:
    fs = resolve(uri, so).fs
    fs.invalidate_cache()  # the listing itself, not fsspec's cache of the writes
    t0 = time.perf_counter()
    inp = list_input(uri, so)
    listed = time.perf_counter() - t0
    plan = plan_parts(inp, records_per_shard=rps, max_bytes_per_shard=256 << 20, storage_options=so, lanes=8)
    refs = sum(len(orjson.dumps(s.to_json())) for s in plan.shards)
    return {
        "store": store,
        "parts": len(inp.parts),
        "list_s": round(listed, 3),
        "plan_s": round(plan.seconds, 3),
        "bytes_read": plan.bytes_read,
        "shards": len(plan.shards),
        "refs_bytes": refs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", type=int, default=10_000)
    ap.add_argument("--records", type=int, default=20, help="records per part")
    ap.add_argument("--records-per-shard", type=int, default=2_000)
    ap.add_argument("--stores", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-parts-") as tmp:
        for store in args.stores:
            server = None
            if store == "s3":
                from tests.support.seaweedfs import start_seaweedfs

                server = start_seaweedfs(Path(tmp) / "seaweedfs")
                uri, so = f"s3://{server.bucket}/parts", server.storage_options()
            else:
                uri, so = str(Path(tmp) / "parts"), {}
            try:
                t0 = time.perf_counter()
                write(uri, so, args.parts, args.records)
                print(
                    f"{store}: wrote {args.parts} parts in {time.perf_counter() - t0:.1f} s", file=sys.stderr
                )
                rows.append(measure(store, uri, so, args.records_per_shard))
            finally:
                if server is not None:
                    server.stop()
    head = ("store", "parts", "list s", "plan s", "bytes read", "shards", "refs bytes")
    print(f"{head[0]:6} {head[1]:>7} {head[2]:>8} {head[3]:>8} {head[4]:>11} {head[5]:>7} {head[6]:>11}")
    for r in rows:
        print(
            f"{r['store']:6} {r['parts']:>7} {r['list_s']:>8.3f} {r['plan_s']:>8.3f} {r['bytes_read']:>11} "
            f"{r['shards']:>7} {r['refs_bytes']:>11}"
        )
    print(json.dumps({"bench": "plan_parts", "records_per_part": args.records, "rows": rows}))


if __name__ == "__main__":
    main()
