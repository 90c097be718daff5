"""Ranged reads on the S3 server and of what the ``pzstd`` tool writes, in a subprocess (the rest in
tests/unit/storage/test_ranges.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_batchinfer.storage.range_plan import plan_ranges
from airflow_batchinfer.storage.ranges import read_range
from tests.support.frames import Sink, read_all


def test_pzstd_output_is_sharded_by_frames(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"id": i, "x": "w" * (i % 300)}) + b"\n" for i in range(120_000)))
    if subprocess.run(["pzstd", "-q", "-p", "2", str(path), "-o", f"{path}.zst"], check=False).returncode:
        pytest.skip("pzstd is not installed")
    ids, _, shards = read_all(f"{path}.zst", 30_000)
    assert ids == list(range(120_000)) and len(shards) >= 2


def test_range_reads_on_s3(root: Any) -> None:
    from airflow_batchinfer.storage.jsonl_file import JsonlFile

    src = root.uri("d.jsonl")
    with JsonlFile(src, storage_options=root.storage_options).writer_sync() as w:
        w.write_many({"id": i, "x": "q" * (i % 40)} for i in range(3000))
    plan = plan_ranges(
        src, records_per_shard=500, max_bytes_per_shard=1 << 30, storage_options=root.storage_options
    )
    assert plan is not None and len(plan.shards) > 3
    ids = []
    for shard in plan.shards:
        rd = read_range(
            shard, id_field="id", assign_ids=False, rejects=Sink(), storage_options=root.storage_options
        )
        ids += [r["id"] for r in rd]
    assert ids == list(range(3000))
