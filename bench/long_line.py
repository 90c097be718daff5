"""One very long input line (printed, not asserted): the peak memory of a shard job reading it.

Generates (streaming, under a temp dir) a plain JSONL file of normal lines with one line of
``--size-mb`` MiB in the middle (default 1024), and reads it as round 0's shard job does: one range
shard over the whole file (:func:`~airflow_batchinfer.storage.ranges.read_range`, the
``RangeRecordReader`` a worker runs), each read in a child process of its own, whose peak RSS
(``VmHWM``) is reported:

* **before**: no bound (``max_line_bytes`` None), the read as it was before the bound existed: the
  line is joined whole and parsed;
* **after**: the default ``max_line_bytes`` (16 MiB): the line is skipped chunk by chunk and goes
  to the rejects as its first KiB and its length.

Run: ``python bench/long_line.py`` or ``python bench/long_line.py --size-mb 256``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from airflow_batchinfer.storage.lines import MAX_LINE_BYTES

NORMAL = 1000  # normal lines before and after the long one
PIECE = 1024 * 1024


def generate(path: Path, size_mb: int) -> int:
    """Write the file a MiB at a time (the generator stays small); its size in bytes."""
    with path.open("wb") as out:
        for i in range(NORMAL):
            out.write(orjson.dumps({"id": f"a{i}", "q": f"what is {i} + {i}?"}) + b"\n")
        out.write(b'{"id":"long","q":"')
        for _ in range(size_mb):
            out.write(b"x" * PIECE)
        out.write(b'"}\n')
        for i in range(NORMAL):
            out.write(orjson.dumps({"id": f"b{i}", "q": f"what is {i} * {i}?"}) + b"\n")
    return path.stat().st_size


def vm_hwm_mb() -> float:
    """This process's peak resident memory, in MB (``VmHWM`` of ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Rejects:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.rows.append(record)


def child(path: str, max_line: int | None) -> None:
    """Read ``path`` as one range shard (as a worker's job does) and print what it cost, as JSON."""
    from airflow_batchinfer.storage.ranges import read_range
    from airflow_batchinfer.storage.shard_ref import RangeRef

    size = os.path.getsize(path)
    shard = RangeRef(shard_id="part-00000", uri=path, records=0, range=(0, size), max_line_bytes=max_line)
    rejects = Rejects()
    started = time.monotonic()
    reader = read_range(shard, id_field="id", assign_ids=False, rejects=rejects)
    records = sum(1 for _ in reader)
    print(json.dumps({
        "records": records, "rejects": len(rejects.rows), "seconds": round(time.monotonic() - started, 2),
        "peak_rss_mb": round(vm_hwm_mb(), 1), "reject_bytes": sum(len(json.dumps(r)) for r in rejects.rows),
    }))  # fmt: skip


def run(path: Path, max_line: int | None) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", str(path)]
    if max_line is not None:
        args += ["--max-line", str(max_line)]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size-mb", type=int, default=1024, help="the long line's size in MiB (default 1024)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--max-line", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.max_line)
        return
    with tempfile.TemporaryDirectory(prefix="batchinfer-long-line-") as tmp:
        path = Path(tmp) / "input.jsonl"
        size = generate(path, args.size_mb)
        print(f"input: {size / 1e6:,.0f} MB, {2 * NORMAL:,} normal lines and one of {args.size_mb:,} MiB")
        print(f"{'read':<40} {'peak RSS MB':>12} {'seconds':>8} {'records':>8} {'rejects':>8}")
        after = f"after (max_line_bytes {MAX_LINE_BYTES >> 20} MiB)"
        for label, max_line in (("before (no bound: the line joined whole)", None), (after, MAX_LINE_BYTES)):
            r = run(path, max_line)
            if "error" in r:
                print(f"{label:<40} failed: {r['error']}")
                continue
            rss, secs = f"{r['peak_rss_mb']:,.0f}", r["seconds"]
            print(f"{label:<40} {rss:>12} {secs:>8} {r['records']:>8} {r['rejects']:>8}")


if __name__ == "__main__":
    main()
