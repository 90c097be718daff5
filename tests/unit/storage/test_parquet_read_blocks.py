"""Parquet files are read by seeking to column chunks: opened with read-ahead blocks of
``parquet_rows.READ_BUFFER``, not the filesystem's default (s3fs: 50 MiB per seek)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.parquet_out import ParquetOutFile
from airflow_batchinfer.storage.parquet_rows import READ_BUFFER
from airflow_batchinfer.storage.pieces import parquet_part_rows
from tests.support.parts import parquet_part

pytest.importorskip("pyarrow")


def spy_opens(monkeypatch: pytest.MonkeyPatch, fs: Any) -> list[dict[str, Any]]:
    """The keyword arguments of every ``fs.open`` from now on (each still opens)."""
    seen: list[dict[str, Any]] = []
    real = fs.open

    def spy(path: str, mode: str = "rb", **kw: Any) -> Any:
        seen.append(kw)
        return real(path, mode, **kw)

    monkeypatch.setattr(fs, "open", spy)
    return seen


def test_a_parquet_part_is_opened_with_small_read_ahead_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    parquet_part("memory://blocks/in/a.parquet", 0, 300, group=100)
    part = JsonlFile("memory://blocks/in/a.parquet")
    seen = spy_opens(monkeypatch, part.loc.fs)
    size = int(part.info()["size"])
    rows = [r["id"] for block in parquet_part_rows(part, size, (1, 3)) for r in block.records]
    assert rows == [f"r{i}" for i in range(100, 300)]
    assert seen and all(kw.get("block_size") == READ_BUFFER for kw in seen)


def test_a_parquet_results_file_is_read_with_small_read_ahead_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    out = ParquetOutFile("memory://blocks/results/round00-part-00000.parquet")
    w = out.writer_sync()
    w.write_many([{"id": f"q{i}", "result": "x"} for i in range(5)])
    w.commit()
    seen = spy_opens(monkeypatch, out.loc.fs)
    assert [n for n, _ in out.iter_lines()] == [1, 2, 3, 4, 5]
    assert seen and all(kw.get("block_size") == READ_BUFFER for kw in seen)
