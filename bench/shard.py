"""Sharding benchmark (printed, not asserted): ``batchinfer shard`` vs the coreutils pipeline.

On the same generated JSONL file (and its ``.zst``), in the same run, for each input size:

* plain → plain shards   vs  ``split -l N``                         (no validation at all)
* plain → .zst shards    vs  ``split -l N --filter 'zstd -3 > $FILE.zst'``
* .zst  → .zst shards    vs  ``zstd -dc | split -l N --filter 'zstd -3 ...'``

Each command runs in its own process; peak RSS is that process tree's (``wait4``). Ours also parses
and validates every record, checks ids, and quarantines bad lines, which ``split`` does not.
Targets: throughput ratio ≥ 0.5 vs the CLI pipeline; our peak RSS ≤ 150 MB and flat across sizes.
The ``.zst`` is written by ``pzstd -3`` (multi-frame; about 8 MiB decoded per frame).

Then round 0's two ways, side by side on the same plain file and the same multi-frame ``.zst``:
``cat FILE > /dev/null`` (reading it once), the copy (``batchinfer shard``, i.e. ``shard_dataset``:
the ``->zst`` rows above, process start-up included) and range planning
(:func:`~airflow_batchinfer.storage.range_plan.plan_ranges`, in this process): MB/s of the input's
stored size, and the bytes planning read.

Run: ``make bench`` or ``python bench/shard.py --sizes-mb 100 1000``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson

from airflow_batchinfer.storage.jsonl_dir import DEFAULT_BYTES_PER_SHARD
from airflow_batchinfer.storage.range_plan import plan_ranges

RECORDS_PER_SHARD = 20_000
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards"]


def generate(path: Path, size_mb: int) -> None:
    rng = random.Random(size_mb)
    target = size_mb * 1024 * 1024
    with path.open("wb") as f:
        i = 0
        while f.tell() < target:
            lines = []
            for _ in range(1000):
                prompt = " ".join(rng.choices(WORDS, k=rng.randint(20, 160)))
                lines.append(orjson.dumps({"id": f"q{i}", "prompt": prompt, "answer": rng.randint(0, 999)}))
                i += 1
            f.write(b"\n".join(lines) + b"\n")


def measure(cmd: list[str] | str, cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of the command's own process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, shell=isinstance(cmd, str), stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"command failed ({os.waitstatus_to_exitcode(status)}): {cmd}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--workdir", type=Path, default=Path(__file__).parent / "out" / "shard")
    args = parser.parse_args()
    for tool in ("split", "zstd", "pzstd"):
        if shutil.which(tool) is None:
            raise SystemExit(f"`{tool}` is needed for the comparison (apt-get install coreutils zstd)")
    batchinfer = str(Path(sys.executable).parent / "batchinfer")
    n = RECORDS_PER_SHARD
    zfilter = "--filter='zstd -q -3 -o $FILE.zst'"
    rows = []
    in_place = []
    for size in args.sizes_mb:
        work = args.workdir / f"{size}mb"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        src = work / "data.jsonl"
        generate(src, size)
        subprocess.run(["pzstd", "-q", "-3", str(src), "-o", str(src) + ".zst"], check=True)
        mb = src.stat().st_size / 2**20
        per_shard = ["--records-per-shard", str(n)]  # as split -l
        cases = [
            (
                "plain->plain",
                f"split -l {n} data.jsonl cli-a-",
                [batchinfer, "shard", "data.jsonl", "ours-a", "--compression", "none", *per_shard],
            ),
            (
                "plain->zst",
                f"split -l {n} {zfilter} data.jsonl cli-b-",
                [batchinfer, "shard", "data.jsonl", "ours-b", *per_shard],
            ),
            (
                "zst->zst",
                f"zstd -dc data.jsonl.zst | split -l {n} {zfilter} - cli-c-",
                [batchinfer, "shard", "data.jsonl.zst", "ours-c", *per_shard],
            ),
        ]
        copy_s = {}
        for name, cli, ours in cases:
            cli_s, _ = measure(cli, work)
            ours_s, ours_rss = measure(ours, work)
            copy_s[name] = ours_s
            rows.append(
                {
                    "input_mb": round(mb),
                    "case": name,
                    "cli_s": round(cli_s, 3),
                    "ours_s": round(ours_s, 3),
                    "cli_mb_s": round(mb / cli_s, 1),
                    "ours_mb_s": round(mb / ours_s, 1),
                    "ratio": round(cli_s / ours_s, 3),
                    "ours_peak_rss_mb": round(ours_rss, 1),
                }
            )
        for name, path, copied in (
            ("jsonl", src, "plain->zst"),
            ("jsonl.zst", work / "data.jsonl.zst", "zst->zst"),
        ):
            stored = path.stat().st_size / 2**20
            cat_s, _ = measure(f"cat {path.name} > /dev/null", work)
            t0 = time.perf_counter()
            plan = plan_ranges(str(path), records_per_shard=n, max_bytes_per_shard=DEFAULT_BYTES_PER_SHARD)
            plan_s = time.perf_counter() - t0
            if plan is None:
                raise SystemExit(f"{path} did not split into ranges")
            in_place.append(
                {
                    "input_mb": round(mb),
                    "file": name,
                    "stored_mb": round(stored, 1),
                    "cat_mb_s": round(stored / cat_s, 1),
                    "copy_mb_s": round(stored / copy_s[copied], 1),
                    "plan_mb_s": round(stored / plan_s, 1),
                    "plan_s": round(plan_s, 4),
                    "plan_read_kb": round(plan.bytes_read / 1024, 1),
                    "shards": len(plan.shards),
                }
            )
        shutil.rmtree(work, ignore_errors=True)

    keys = ("input_mb", "case", "cli_s", "ours_s", "cli_mb_s", "ours_mb_s", "ratio", "ours_peak_rss_mb")
    print("\n" + " ".join(f"{k:>14}" for k in keys))
    for r in rows:
        print(" ".join(f"{r[k]:>14}" for k in keys))
    keys = ("input_mb", "file", "stored_mb", "cat_mb_s", "copy_mb_s", "plan_mb_s", "plan_s", "plan_read_kb")
    print("\nround 0: read once (cat) vs copy (shard_dataset) vs range planning (nothing copied)")
    print(" ".join(f"{k:>12}" for k in keys) + f"{'shards':>8}")
    for r in in_place:
        print(" ".join(f"{r[k]:>12}" for k in keys) + f"{r['shards']:>8}")
    print(json.dumps({"bench": "shard", "rows": rows, "in_place": in_place}))


if __name__ == "__main__":
    main()
