"""Parquet output files on local disk and on the real S3 server: a file appears only when its upload
completes, an aborted one leaves nothing, a promotion converts staged JSONL into it, and the files
of a directory read back (rows, ids' digests) and as one pyarrow dataset, the run's input columns
typed columns of their own."""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest

from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.storage.digest import IdDigest, file_digest
from airflow_batchinfer.storage.parquet_out import ParquetOutFile
from airflow_batchinfer.storage.record_file import convert
from tests.support.roots import Root, visible_names

ROWS = [{"id": f"q{i}", "question": f"{i}?", "result": str(i), "status": "approved", "attempts": 1,
         "round": 0, "judgment": {"approved": True, "score": i / 10}} for i in range(3000)]  # fmt: skip
ROWS[7]["question"] = 7  # not its column's type: kept in record, read back as written
INPUTS = (("question", "string"),)


def test_commit_abort_and_a_promotion_by_conversion(root: Root) -> None:
    so = root.storage_options
    aborted = ParquetOutFile(
        root.uri("results", "round00-part-00001.parquet"), storage_options=so, inputs=INPUTS
    )
    w = aborted.writer_sync()
    w.write_many(ROWS)
    w.abort()
    assert visible_names(root, "results") == []  # neither the file nor any temporary

    staged = root.uri("staged", "approved.jsonl.zst")
    with JsonlFile(staged, storage_options=so).writer_sync() as jw:
        jw.write_many(ROWS[:1500])
    final = root.uri("results", "round00-part-00000.parquet")
    assert convert(staged, final, storage_options=so, inputs=INPUTS) == 1500
    assert not JsonlFile(staged, storage_options=so).exists()  # converted, then removed
    assert visible_names(root, "results") == ["round00-part-00000.parquet"]
    with pytest.raises(FileNotFoundError):  # a concurrent close took it: the final file stays as it was
        convert(staged, final, storage_options=so)

    with ParquetOutFile(
        root.uri("results", "round01-part-00000.parquet"), storage_options=so, inputs=INPUTS
    ).writer_sync() as pw:
        pw.write_many(ROWS[1500:])
    files = JsonlDir(root.uri("results"), storage_options=so).jsonl_files()
    assert [r for f in files for r in f.iter_records()] == ROWS
    assert sum((file_digest(f, "id") for f in files), IdDigest()) == IdDigest.of(r["id"] for r in ROWS)
    fs = aborted.loc.fs
    dataset = ds.dataset(files[0].loc.path.rsplit("/", 1)[0], filesystem=fs, format="parquet")
    assert dataset.count_rows() == 3000
    questions = dataset.to_table(columns=["question"]).column("question").to_pylist()
    assert sorted(questions, key=str) == sorted((r["question"] if r["question"] != 7 else None
                                                 for r in ROWS), key=str)  # fmt: skip
