"""Part inputs for the part-input tests: directories of JSONL / zstd part files, and reading every
range shard of a plan back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import zstandard

from airflow_batchinfer.storage.location import resolve
from airflow_batchinfer.storage.manifest import OutputManifest
from airflow_batchinfer.storage.range_plan import shard_ranges
from airflow_batchinfer.storage.ranges import read_range
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef
from tests.support.frames import Sink


def plan_input(
    src: Path | str, run: Path, rps: int = 400, **kw: Any
) -> tuple[list[RangeRef], OutputManifest]:
    """``src`` planned into ``run/input`` (:func:`shard_ranges`): its range shards and the input's
    manifest. Shards of up to 1 GiB, ids in ``id``, none assigned, unless ``kw`` says otherwise."""
    args: dict[str, Any] = {"max_bytes_per_shard": 1 << 30, "id_field": "id", "assign_ids": False, **kw}
    planned = shard_ranges(str(src), str(run / "input"), records_per_shard=rps, **args)
    assert planned is not None
    return [s for s in planned[0] if isinstance(s, RangeRef)], planned[1]


def part_bytes(first: int, n: int, *, zstd: bool = False, frame_lines: int = 0) -> bytes:
    """``n`` records with ids ``first..first+n-1``; zstd: in frames of ``frame_lines`` lines (0: one
    frame)."""
    lines = [orjson.dumps({"id": f"r{i}", "q": "x" * 24}) + b"\n" for i in range(first, first + n)]
    if not zstd:
        return b"".join(lines)
    cctx = zstandard.ZstdCompressor()
    step = frame_lines or max(n, 1)
    return b"".join(cctx.compress(b"".join(lines[i : i + step])) for i in range(0, max(n, 1), step))


def put(uri: str | Path, data: bytes, so: dict[str, Any] | None = None) -> None:
    """``data`` stored at ``uri`` (a path or any fsspec URI), its directories made."""
    loc = resolve(str(uri), so)
    if loc.is_local:
        Path(loc.path).parent.mkdir(parents=True, exist_ok=True)
    loc.fs.pipe_file(loc.path, data)


def write_parts(
    root: Path | str,
    sizes: Sequence[int],
    *,
    ext: str = ".jsonl",
    frame_lines: int = 0,
    so: dict[str, Any] | None = None,
) -> int:
    """``part-<i><ext>`` under ``root`` (a path or any fsspec URI) holding ``sizes[i]`` records each
    (ids numbered across all parts); returns the record count."""
    first = 0
    for i, n in enumerate(sizes):
        data = part_bytes(first, n, zstd=ext.endswith(".zst"), frame_lines=frame_lines) if n else b""
        put(f"{root}/part-{i}{ext}", data, so)
        first += n
    return first


def read_shards(
    shards: Sequence[ShardRef | RangeRef], so: dict[str, Any] | None = None
) -> tuple[list[Any], Sink]:
    """Every record id the plan's range shards read, in order, and their rejects."""
    rejects = Sink()
    ids = [
        r["id"]
        for s in shards
        if isinstance(s, RangeRef)
        for r in read_range(s, id_field="id", assign_ids=False, rejects=rejects, storage_options=so)
    ]
    return ids, rejects


def pieces_of(shards: Sequence[ShardRef | RangeRef]) -> list[list[str]]:
    """Each shard's pieces as ``name[a:b]``."""
    return [
        [f"{Path(p.uri).name}{list(p.range or p.rows or ())}" for p in (s.pieces or ())]
        for s in shards
        if isinstance(s, RangeRef)
    ]


def parquet_part(
    uri: str | Path,
    first: int,
    n: int,
    *,
    group: int = 100,
    so: dict[str, Any] | None = None,
    **cols: list[Any],
) -> None:
    """A Parquet part at ``uri`` of ``n`` rows with ids ``r<first>...`` (and ``cols``), in row groups
    of ``group`` rows."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": [f"r{i}" for i in range(first, first + n)], "q": ["x" * 8] * n, **cols})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=group)
    put(uri, buf.getvalue(), so)
