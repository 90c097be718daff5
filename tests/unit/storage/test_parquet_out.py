"""Parquet output files on local disk: atomic commit, abort, bounded row groups, one schema whatever
the rows hold, and rows read back as they were written. Files here have no input columns (the fixed
schema of a run planned before they were pinned: ``id``, ``record``, the generation's columns); those
with pinned input columns: ``test_parquet_columns``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_batchinfer.exceptions import ConfigError, StorageError
from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.storage.digest import IdDigest, file_digest, file_ids
from airflow_batchinfer.storage.location import resolve
from airflow_batchinfer.storage.parquet_out import ParquetOutFile, ParquetOutWriter
from airflow_batchinfer.storage.parquet_schema import COLUMNS
from airflow_batchinfer.storage.record_file import record_file


def _row(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": f"q{i}", "question": f"what is {i}?", "result": f"{i}", "status": "approved",
            "error": None, "judgment": {"verdict": "approve", "score": 0.5}, "attempts": 1, "round": 0,
            **extra}  # fmt: skip


def test_rows_read_back_as_written_and_the_file_appears_only_at_commit(tmp_path: Path) -> None:
    rows = [
        _row(1),
        _row(2, candidates=[{"index": 0, "result": "a"}, {"index": 1, "result": "b"}], status="rejected"),
        {"id": 7, "status": 3, "error": "boom", "attempts": True, "nested": {"a": [1, None]}},  # odd types
        {"id": "q8", "judgment": "plain text", "round": 2**63},
    ]
    path = tmp_path / "results" / "round00-part-00000.parquet"
    w = ParquetOutFile(str(path)).writer_sync()
    w.write_many(rows[:2])
    w.write(rows[2])
    w.write_many(rows[3:])
    assert not path.exists() and os.listdir(path.parent)[0].startswith(".")  # a hidden temporary only
    w.commit()
    assert os.listdir(path.parent) == [path.name]
    back = list(record_file(str(path)).iter_records())
    assert back == rows  # every value and type as written, a null error and odd types included
    table = pq.read_table(path)
    assert table.column_names == list(COLUMNS)
    assert table.column("id").to_pylist() == ["q1", "q2", "7", "q8"]
    assert table.column("status").to_pylist() == ["approved", "rejected", None, None]  # 3 stays in record
    assert orjson.loads(table.column("judgment")[0].as_py()) == {"verdict": "approve", "score": 0.5}


def test_abort_and_a_failed_block_leave_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rejected" / "part-00000.parquet"
    w = ParquetOutFile(str(path)).writer_sync()
    w.write_many([_row(i) for i in range(10)])
    w.abort()
    assert os.listdir(path.parent) == []
    with (
        pytest.raises(TypeError, match="not JSON-serializable"),
        ParquetOutFile(str(path)).writer_sync() as w2,
    ):
        w2.write(_row(1, bad={1, 2}))
    assert os.listdir(path.parent) == []

    async def cancelled() -> None:  # through the async writer the jobs use
        async with ParquetOutFile(str(path)).writer() as aw:
            await aw.write_many([_row(i) for i in range(600)])
            raise RuntimeError("job failed")

    with pytest.raises(RuntimeError):
        asyncio.run(cancelled())
    assert os.listdir(path.parent) == []


def test_row_groups_are_bounded_by_rows_and_bytes(tmp_path: Path) -> None:
    by_rows, by_bytes = tmp_path / "a.parquet", tmp_path / "b.parquet"
    with ParquetOutWriter(resolve(str(by_rows)), row_group_rows=100) as w:
        w.write_many(_row(i) for i in range(1050))
    meta = pq.ParquetFile(by_rows).metadata
    assert meta.num_rows == 1050 and meta.num_row_groups == 11
    assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == 100
    with ParquetOutWriter(resolve(str(by_bytes)), row_group_bytes=10_000) as w:
        w.write_many(_row(i, text="x" * 1000) for i in range(100))
    meta = pq.ParquetFile(by_bytes).metadata
    assert meta.num_rows == 100 and meta.num_row_groups >= 10
    assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) <= 10


def test_files_of_different_rows_read_as_one_dataset(tmp_path: Path) -> None:
    """Shards whose rows have other fields (and an empty one) share one schema: one dataset."""
    d = tmp_path / "results"
    with ParquetOutFile(str(d / "round00-part-00000.parquet")).writer_sync() as w:
        w.write_many([_row(1), _row(2)])
    with ParquetOutFile(str(d / "round01-part-00000.parquet"), id_field="uid").writer_sync() as w:
        w.write_many([{"uid": 5, "text": ["a"], "status": "approved", "attempts": 2, "round": 1}])
    ParquetOutFile(str(d / "tail-part-00000.parquet")).writer_sync().commit()  # no rows
    schemas = {pq.read_schema(p) for p in d.iterdir()}
    assert len(schemas) == 1
    table = ds.dataset(str(d), format="parquet").to_table()
    assert table.num_rows == 3 and sorted(table.column("id").to_pylist()) == ["5", "q1", "q2"]
    back = [r for f in JsonlDir(str(d)).jsonl_files() for r in f.iter_records()]
    assert sorted(str(r.get("id", r.get("uid"))) for r in back) == ["5", "q1", "q2"]


def test_ids_read_from_parquet_are_the_ids_written_whatever_their_type(tmp_path: Path) -> None:
    """The invariant's and close's reads (digests, named ids) see a Parquet file as its JSONL twin."""
    rows = [{"id": "q1"}, {"id": 12, "status": "approved"}, {"x": 1, "id": 'é\\n"x'}]
    jsonl, parquet = JsonlFile(str(tmp_path / "a.jsonl.zst")), ParquetOutFile(str(tmp_path / "a.parquet"))
    for f in (jsonl, parquet):
        with f.writer_sync() as w:
            w.write_many(rows)
    assert file_digest(parquet, "id") == file_digest(jsonl, "id") == IdDigest.of(r["id"] for r in rows)
    assert list(file_ids([parquet], "id")) == ["q1", 12, 'é\\n"x']


def test_a_foreign_parquet_file_is_refused_by_name(tmp_path: Path) -> None:
    import pyarrow as pa

    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    with pytest.raises(StorageError, match=r"other\.parquet is not a batchinfer output file"):
        list(ParquetOutFile(str(path)).iter_records())


def test_without_pyarrow_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import builtins

    real = builtins.__import__

    def no_pyarrow(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("pyarrow"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ConfigError, match=r"pip install 'airflow-batchinfer\[parquet\]'"):
        ParquetOutFile(str(tmp_path / "x.parquet")).writer_sync()
    assert not list(tmp_path.iterdir())
