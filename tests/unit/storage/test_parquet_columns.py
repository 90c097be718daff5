"""The input's columns in a Parquet run's output: decided once from the input (a JSONL sample, a
Parquet footer), pinned at planning and kept by a resumed run; rows written with them read back as
they were written, whatever a later row holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.parquet_columns import (
    Column,
    OutputColumns,
    decide,
    from_arrow,
    from_records,
    pinned,
    read_columns,
    write_columns,
)
from airflow_batchinfer.storage.parquet_out import ParquetOutFile
from airflow_batchinfer.storage.record_file import record_file
from tests.support.parts import parquet_part


def test_a_jsonl_sample_types_scalars_and_keeps_nested_or_mixed_fields_as_json() -> None:
    records = [
        {"id": "a", "prompt": "p", "n": 1, "x": 0.5, "ok": True, "tags": ["t"], "mix": 1, "none": None},
        {"id": "b", "prompt": "q", "n": None, "x": 1.5, "ok": False, "tags": [], "mix": "one", "late": 3},
        {"status": "kept as the generation's", "result": 1, "record": {}},
    ]
    assert [(c.name, c.type) for c in from_records(records)] == [
        ("prompt", "string"), ("n", "int64"), ("x", "float64"), ("ok", "bool"), ("tags", "json"),
        ("mix", "json"), ("none", "json"), ("late", "int64"),
    ]  # fmt: skip


def test_a_parquet_footer_maps_arrow_types_to_output_columns() -> None:
    schema = pa.schema(
        [("id", pa.string()), ("text", pa.large_string()), ("n", pa.int32()), ("u", pa.uint64()),
         ("score", pa.float32()), ("flag", pa.bool_()), ("at", pa.timestamp("s")), ("d", pa.date32()),
         ("price", pa.decimal128(10, 2)), ("meta", pa.struct([("k", pa.int64())])),
         ("xs", pa.list_(pa.string())), ("round", pa.int64())]
    )  # fmt: skip
    assert [(c.name, c.type) for c in from_arrow(schema)] == [
        ("text", "string"), ("n", "int64"), ("u", "int64"), ("score", "float64"), ("flag", "bool"),
        ("at", "string"), ("d", "string"), ("price", "string"), ("meta", "json"), ("xs", "json"),
    ]  # fmt: skip


def test_decide_reads_a_jsonl_files_first_records_or_a_parquet_parts_footer(tmp_path: Path) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"id": "a", "prompt": "hi", "n": 1}\nnot json\n{"id": "b", "prompt": "yo", "n": 2}\n')
    assert decide(str(jsonl)).pairs() == (("prompt", "string"), ("n", "int64"))
    part = tmp_path / "part-0.parquet"
    parquet_part(part, 0, 3, score=[0.5, 1.5, None])
    doc = decide(str(part))
    assert doc.pairs() == (("q", "string"), ("score", "float64")) and "Parquet footer" in doc.source


def test_the_pinned_document_round_trips_and_a_foreign_one_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "output_columns.json")
    assert read_columns(uri) is None and pinned(uri) == ()  # a run planned before: the fixed schema
    doc = OutputColumns(columns=[Column(name="prompt", type="string")], source="test")
    write_columns(uri, doc)
    assert json.loads(Path(uri).read_text())["schema_version"] == 1
    assert read_columns(uri) == doc and pinned(uri) == (("prompt", "string"),)
    Path(uri).write_text('{"schema_version": 1, "columns": [{"name": "x", "type": "date"}], "source": ""}')
    with pytest.raises(StorageError, match="not an output columns document"):
        read_columns(uri)


INPUTS = (("prompt", "string"), ("n", "int64"), ("x", "float64"), ("ok", "bool"), ("meta", "json"))


def test_rows_read_back_as_written_when_a_field_changes_type_mid_file(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"id": "a", "prompt": "p", "n": 1, "x": 0.5, "ok": True, "meta": {"k": [1, None]}, "result": "r"},
        {"id": 7, "prompt": 3, "n": "one", "x": 2, "ok": None, "meta": "text", "extra": {"z": 1}},
        {"id": "c", "n": 2**63, "x": None, "meta": None, "status": "approved"},  # absent, null, too big
        {"id": "d", "prompt": "", "n": -1, "x": 1e300, "ok": False, "meta": [], "error": None},
    ]
    path = tmp_path / "results" / "round00-part-00000.parquet"
    with ParquetOutFile(str(path), inputs=INPUTS).writer_sync() as w:
        w.write_many(rows)
    assert list(record_file(str(path)).iter_records()) == rows  # every value and type as written
    table = pq.read_table(path)
    assert table.column_names[:6] == ["id", "prompt", "n", "x", "ok", "meta"]
    assert table.column_names[-1] == "record"
    assert table.schema.field("n").type == pa.int64() and table.schema.field("ok").type == pa.bool_()
    assert table.column("id").to_pylist() == ["a", "7", "c", "d"]
    assert table.column("prompt").to_pylist() == ["p", None, None, ""]  # 3 stays in record
    assert table.column("n").to_pylist() == [1, None, None, -1]
    assert table.column("x").to_pylist() == [0.5, None, None, 1e300]  # the int 2 stays in record
    assert table.column("meta").to_pylist() == ['{"k":[1,null]}', '"text"', None, "[]"]
    overflow = [json.loads(r) for r in table.column("record").to_pylist()]
    assert overflow[0] == {"id": "a"} and overflow[1] == {"id": 7, "prompt": 3, "n": "one", "x": 2,
                                                          "ok": None, "extra": {"z": 1}}  # fmt: skip
    assert overflow[2] == {"id": "c", "n": 2**63, "x": None, "meta": None}
    got = duckdb.sql(f"select prompt, n from '{path}' where ok").fetchall()
    assert got == [("p", 1)]  # real columns, no json_extract


def test_files_with_pinned_columns_read_as_one_dataset(tmp_path: Path) -> None:
    d = tmp_path / "results"
    with ParquetOutFile(str(d / "a.parquet"), inputs=INPUTS).writer_sync() as w:
        w.write_many([{"id": "a", "prompt": "p", "n": 1}])
    with ParquetOutFile(str(d / "b.parquet"), inputs=INPUTS).writer_sync() as w:
        w.write_many([{"id": "b", "prompt": 5, "other": True}])  # nothing fits: all in record
    ParquetOutFile(str(d / "c.parquet"), inputs=INPUTS).writer_sync().commit()  # no rows
    assert len({pq.read_schema(p) for p in d.iterdir()}) == 1
    table = ds.dataset(str(d), format="parquet").to_table()
    assert sorted(table.column("prompt").to_pylist(), key=str) == [None, "p"]


def _cfg(tmp_path: Path, src: Path) -> RunConfig:
    return RunConfig.of(input=str(src), run_root=str(tmp_path / "run"), prompt_template="{{ prompt }}",
                        judge={"type": "length", "min_chars": 1}, records_per_shard=10,
                        output_format="parquet")  # fmt: skip


def test_prepare_pins_the_columns_once_and_a_resumed_run_keeps_them(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"p{i}", "n": i}) + "\n" for i in range(30)))
    cfg = _cfg(tmp_path, src)
    uri = RunLayout(cfg.run_root).output_columns
    prepare_run(cfg)
    assert pinned(uri) == (("prompt", "string"), ("n", "int64"))
    write_columns(uri, OutputColumns(columns=[Column(name="n", type="json")], source="kept"))
    prepare_run(cfg)  # resumed: the pinned columns stand, never decided again
    assert read_columns(uri) == OutputColumns(columns=[Column(name="n", type="json")], source="kept")


def test_a_run_planned_before_columns_were_pinned_keeps_the_fixed_schema(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"p{i}"}) + "\n" for i in range(30)))
    cfg = _cfg(tmp_path, src)
    prepare_run(cfg)
    uri = Path(RunLayout(cfg.run_root).output_columns)
    uri.unlink()  # as such a run left it: run.json, no columns
    prepare_run(cfg)
    assert not uri.exists()


def test_prepare_pins_a_parquet_part_inputs_columns(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parquet_part(parts / "part-0.parquet", 0, 15, k=list(range(15)))
    parquet_part(parts / "part-1.parquet", 15, 15, k=[str(i) for i in range(15)])  # another type: overflow
    cfg = _cfg(tmp_path, parts).replace(prompt_template="{{ q }}")
    prepare_run(cfg)
    assert pinned(RunLayout(cfg.run_root).output_columns) == (("q", "string"), ("k", "int64"))
