"""Round 0 over Parquet parts (printed, not asserted): planning and reading in place against
``pyarrow.dataset``, and the peak memory of reading wide rows.

Builds under a temp dir (nothing downloaded) a dataset of ``--rows`` rows (default 1,000,000) in
``--files`` Parquet files (default 5) with row groups of ``--row-group-rows`` (default 100,000):
an id, a few short string columns, a prompt-like text of ``--prompt-chars`` characters on average
(random words) and two numbers. Then, each in a child process of its own whose peak RSS
(``VmHWM``) and wall time are reported (and its CPU seconds, all threads', in the closing JSON and
the planning line: wall times swing on a shared machine, the threaded scan's most):

* **baseline**: Python with pyarrow and this package imported, nothing read;
* **ours**: round 0's way: every file's row groups planned from its footer
  (:func:`~airflow_batchinfer.storage.parquet_rows.row_groups`; the bytes it read are counted), then
  each row group read as one shard job does
  (:func:`~airflow_batchinfer.storage.parquet_rows.parquet_blocks`, ``--batch-rows`` rows a block:
  each row converted once, ``to_pylist``, with no JSON line made of it) through a
  :class:`~airflow_batchinfer.storage.validate.LineValidator` (ids, repeats and rejects checked);
* **pyarrow.dataset**: ``pyarrow.dataset.dataset(dir).to_batches()`` (its defaults: threads on,
  131,072-row batches) and ``to_pylist()`` of every batch: the same files to Python dicts.

Then a file of ``--wide-mb`` MiB (default 1024) of wide rows (``--wide-row-kb`` KiB of text each, in
``--wide-groups`` row groups) read by ``parquet_blocks`` at ``--wide-batch-rows`` rows (default
64), with its page buffer (as shipped) and without (pyarrow's default: a column chunk read whole), and
by ``pyarrow.dataset`` at the same batch size.

Run: ``python bench/parquet_read.py`` (or smaller: ``--rows 200000 --wide-mb 256``).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_rng = random.Random(0)
WORDS = ["".join(_rng.choices("abcdefghijklmnopqrstuvwxyz", k=_rng.randint(2, 11))) for _ in range(5000)]


def corpus(chars: int, seed: int) -> str:
    """Random words, ``chars`` characters or a few more (the text the prompts are cut from)."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def build_dataset(root: Path, rows: int, files: int, group_rows: int, prompt_chars: int) -> int:
    """The files of the 1M-row dataset (a row group at a time); their total size in bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = corpus(4 * 1024 * 1024, seed=1)
    rng = random.Random(2)
    per_file = -(-rows // files)
    done = 0
    for f in range(files):
        n_file = min(per_file, rows - done)
        with pq.ParquetWriter(root / f"part-{f:05d}.parquet", SCHEMA()) as writer:
            for lo in range(0, n_file, group_rows):
                n = min(group_rows, n_file - lo)
                first = done + lo
                lengths = [rng.randint(prompt_chars // 3, prompt_chars * 5 // 3) for _ in range(n)]
                starts = [rng.randrange(len(text) - 2 * prompt_chars) for _ in range(n)]
                table = pa.table(
                    {
                        "id": [f"q{first + i:09d}" for i in range(n)],
                        "source": [("wiki", "forum", "docs", "chat")[(first + i) % 4] for i in range(n)],
                        "lang": [("en", "fr", "de")[(first + i) % 3] for i in range(n)],
                        "prompt": [text[s : s + k] for s, k in zip(starts, lengths, strict=True)],
                        "max_tokens": [64 + (first + i) % 448 for i in range(n)],
                        "temperature": [((first + i) % 10) / 10 for i in range(n)],
                    },
                    schema=SCHEMA(),
                )
                writer.write_table(table, row_group_size=group_rows)
        done += n_file
    return sum(p.stat().st_size for p in root.glob("*.parquet"))


def SCHEMA() -> Any:  # a constant, built once pyarrow is imported
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("lang", pa.string()),
            ("prompt", pa.string()),
            ("max_tokens", pa.int64()),
            ("temperature", pa.float64()),
        ]
    )


def build_wide(path: Path, size_mb: int, row_kb: int, groups: int) -> int:
    """One file of ``size_mb`` MiB of ``row_kb`` KiB rows in ``groups`` row groups (one in memory at
    a time while it is written); its size in bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = size_mb * 1024 // row_kb
    group_rows = -(-rows // groups)
    text = corpus(16 * 1024 * 1024, seed=3)
    row_chars = row_kb * 1024
    rng = random.Random(4)
    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    # pyarrow checks a page's 1 MiB bound every write_batch_size values (1,024 by default: 100 MiB
    # pages of 100 KiB rows); a reader holds a page, so write ~1 MiB ones, as Spark's writer does
    with pq.ParquetWriter(path, schema, write_batch_size=max(1, 1024 // row_kb)) as writer:
        for lo in range(0, rows, group_rows):
            n = min(group_rows, rows - lo)
            starts = [rng.randrange(len(text) - row_chars) for _ in range(n)]
            table = pa.table(
                {
                    "id": [f"w{lo + i:07d}" for i in range(n)],
                    "text": [text[s : s + row_chars] for s in starts],
                },
                schema=schema,
            )
            writer.write_table(table, row_group_size=n)
            del table
    return path.stat().st_size


# ----------------------------------------------------------------------------------- children
class Counting(io.RawIOBase):
    """A file that counts the bytes read through it (planning's reads)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return int(self._raw.seek(pos, whence))

    def tell(self) -> int:
        return int(self._raw.tell())

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._raw.read(n)
        self.bytes_read += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class CountingSink:
    def __init__(self) -> None:
        self.rows = 0

    def write(self, record: dict[str, Any]) -> None:
        self.rows += 1


def ours(paths: list[Path], batch_rows: int, buffer: int | None) -> dict[str, Any]:
    from airflow_batchinfer.storage import parquet_rows
    from airflow_batchinfer.storage.reader import ErrorPolicy
    from airflow_batchinfer.storage.validate import LineValidator

    if buffer is not None:
        parquet_rows.READ_BUFFER = buffer
    started = time.monotonic()
    plans, planned_bytes = [], 0
    for path in paths:
        with path.open("rb") as f:
            raw = Counting(f)
            plans.append((path, parquet_rows.row_groups(raw, path.stat().st_size, str(path))))  # type: ignore[arg-type]
            planned_bytes += raw.bytes_read
    plan_s = time.monotonic() - started
    records = rejects = 0
    for path, groups in plans:
        with path.open("rb") as f:
            for group in groups:  # one shard per row group, a validator each (a shard job)
                sink = CountingSink()
                validator = LineValidator(ErrorPolicy(str(path), "quarantine", sink), id_field="id")
                shard = (group.index, group.index + 1)
                for block in parquet_rows.parquet_blocks(f, shard, source=str(path), batch_rows=batch_rows):
                    records += len(validator.check_block(block)[2])
                rejects += sink.rows
    return {
        "records": records,
        "rejects": rejects,
        "plan_ms": round(plan_s * 1000, 1),
        "plan_kb": round(planned_bytes / 1024, 1),
        "row_groups": sum(len(g) for _, g in plans),
        "seconds": round(time.monotonic() - started, 2),
    }


def dataset_scan(root: Path, batch_rows: int | None) -> dict[str, Any]:
    import pyarrow.dataset as ds

    started = time.monotonic()
    kw = {} if batch_rows is None else {"batch_size": batch_rows}
    records = 0
    for batch in ds.dataset(str(root), format="parquet").to_batches(**kw):
        records += len(batch.to_pylist())
    return {"records": records, "seconds": round(time.monotonic() - started, 2)}


def vm_hwm_mb() -> float:
    """This process's peak resident memory, in MB: ``VmHWM``, not ``getrusage``'s ``ru_maxrss``,
    which Linux carries over ``exec`` from the forked parent (this bench's, after building)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(args: argparse.Namespace) -> None:
    import pyarrow  # noqa: F401 - the baseline holds what every reader imports

    import airflow_batchinfer.storage.validate  # noqa: F401

    root = Path(args.dir)
    paths = sorted(root.glob("*.parquet"))
    if args.child == "baseline":
        out: dict[str, Any] = {"records": 0, "seconds": 0.0}
    elif args.child == "ours":
        out = ours(paths, args.batch_rows, args.buffer)
    else:
        out = dataset_scan(root, args.batch_rows)
    out["peak_rss_mb"] = round(vm_hwm_mb(), 1)
    out["cpu_s"] = round(time.process_time(), 2)  # all its threads': less swayed by a loaded machine
    print(json.dumps(out))


def run(what: str, root: Path, batch_rows: int | None = None, buffer: int | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", what, "--dir", str(root)]
    if batch_rows is not None:
        cmd += ["--batch-rows", str(batch_rows)]
    if buffer is not None:
        cmd += ["--buffer", str(buffer)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def row(label: str, r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"{label:<52} failed: {r['error']}")
        return
    rate = f"{r['records'] / r['seconds']:,.0f}" if r["seconds"] else "-"
    print(f"{label:<52} {r['records']:>9,} {r['seconds']:>8} {rate:>10} {r['peak_rss_mb']:>9,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--row-group-rows", type=int, default=100_000)
    parser.add_argument("--prompt-chars", type=int, default=600)
    parser.add_argument("--batch-rows", type=int, default=1000, help="ours: rows per block (chunk_size)")
    parser.add_argument("--wide-mb", type=int, default=1024, help="the wide file's size (0: skip it)")
    parser.add_argument("--wide-row-kb", type=int, default=100)
    parser.add_argument("--wide-groups", type=int, default=4)
    parser.add_argument("--wide-batch-rows", type=int, default=64)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--buffer", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    figures: dict[str, Any] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="batchinfer-parquet-") as tmp:
        data, wide = Path(tmp) / "data", Path(tmp) / "wide"
        data.mkdir()
        wide.mkdir()
        started = time.monotonic()
        size = build_dataset(data, args.rows, args.files, args.row_group_rows, args.prompt_chars)
        print(
            f"dataset: {args.rows:,} rows in {args.files} files, row groups of {args.row_group_rows:,} rows, "
            f"{size / 1e6:,.0f} MB stored (built in {time.monotonic() - started:.0f} s)"
        )
        print(f"{'read':<52} {'records':>9} {'seconds':>8} {'records/s':>10} {'peak MB':>9}")
        figures["baseline"] = run("baseline", data)
        row("baseline (imports only)", figures["baseline"])
        figures["ours"] = run("ours", data, args.batch_rows)
        row(f"ours: plan + parquet_blocks + validate ({args.batch_rows:,}/block)", figures["ours"])
        figures["dataset"] = run("dataset", data)
        row("pyarrow.dataset to_batches() + to_pylist()", figures["dataset"])
        o, d = figures["ours"], figures["dataset"]
        if "error" not in o and "error" not in d:
            print(
                f"planning: {o['row_groups']} row groups in {o['plan_ms']} ms, reading {o['plan_kb']} KB of "
                f"{size / 1e6:,.0f} MB; ours / dataset records/s: {d['seconds'] / o['seconds']:.2f} "
                f"(CPU seconds, all threads: ours {o['cpu_s']}, dataset {d['cpu_s']})"
            )
        if args.wide_mb:
            drop_files(data)
            started = time.monotonic()
            wsize = build_wide(wide / "wide.parquet", args.wide_mb, args.wide_row_kb, args.wide_groups)
            print(
                f"\nwide file: {wsize / 1e6:,.0f} MB stored, rows of {args.wide_row_kb} KiB in "
                f"{args.wide_groups} row groups (built in {time.monotonic() - started:.0f} s)"
            )
            print(f"{'read':<52} {'records':>9} {'seconds':>8} {'records/s':>10} {'peak MB':>9}")
            b = args.wide_batch_rows
            figures["wide_ours"] = run("ours", wide, b)
            row(f"ours ({b}/block, page buffer 1 MiB)", figures["wide_ours"])
            figures["wide_unbuffered"] = run("ours", wide, b, buffer=0)
            row(f"ours ({b}/block, no buffer: column chunks whole)", figures["wide_unbuffered"])
            figures["wide_dataset"] = run("dataset", wide, b)
            row(f"pyarrow.dataset to_batches(batch_size={b})", figures["wide_dataset"])
    print(f"total: {time.monotonic() - began:.0f} s")
    print(json.dumps(figures))


def drop_files(path: Path) -> None:
    """Drop the first dataset before building the wide file (the temp dir's disk)."""
    for p in path.glob("*.parquet"):
        p.unlink()


if __name__ == "__main__":
    main()
