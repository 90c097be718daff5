from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import CorruptFileError, MalformedRecordError
from airflow_batchinfer.storage import JsonlDir, JsonlFile
from tests.support.roots import Root, visible_names

RECORDS = [{"id": i, "text": f"hello {i}", "nested": {"k": [i, None, True]}} for i in range(2500)]


@pytest.mark.parametrize("name", ["data.jsonl", "data.jsonl.zst", "DATA.JSONL.ZSTD"])
def test_round_trip_sync(root: Root, name: str) -> None:
    f = JsonlFile(root.uri(name), storage_options=root.storage_options)
    with f.writer_sync() as w:
        w.write(RECORDS[0])
        w.write_many(RECORDS[1:])
    assert f.exists()
    assert f.compressed == name.lower().endswith((".zst", ".zstd"))
    assert list(f.iter_records()) == RECORDS


async def test_round_trip_async(root: Root) -> None:
    f = JsonlFile(root.uri("a.jsonl.zst"), storage_options=root.storage_options)
    async with f.writer() as w:
        for r in RECORDS[:1000]:
            await w.write(r)
        await w.write_many(RECORDS[1000:])
    got = [r async for r in f.iter_records()]
    assert got == RECORDS


def test_compressed_file_is_really_zstd(root: Root) -> None:
    f = JsonlFile(root.uri("a.jsonl.zst"), storage_options=root.storage_options)
    with f.writer_sync() as w:
        w.write_many(RECORDS)
    with f.loc.fs.open(f.loc.path, "rb") as raw:
        assert raw.read(4) == b"\x28\xb5\x2f\xfd"  # zstd magic


def test_writer_exception_leaves_nothing(root: Root) -> None:
    f = JsonlFile(root.uri("sub", "a.jsonl.zst"), storage_options=root.storage_options)
    with pytest.raises(RuntimeError, match="boom"), f.writer_sync() as w:
        w.write_many(RECORDS)
        raise RuntimeError("boom")
    assert not f.exists()
    assert visible_names(root, "sub") == []  # no temp files either


async def test_async_writer_exception_leaves_nothing(root: Root) -> None:
    f = JsonlFile(root.uri("b.jsonl"), storage_options=root.storage_options)
    with pytest.raises(RuntimeError, match="boom"):
        async with f.writer() as w:
            await w.write_many(RECORDS)
            raise RuntimeError("boom")
    assert not f.exists()
    assert visible_names(root) == []


def test_rewrite_replaces_whole_file(root: Root) -> None:
    f = JsonlFile(root.uri("a.jsonl.zst"), storage_options=root.storage_options)
    with f.writer_sync() as w:
        w.write_many(RECORDS)
    with f.writer_sync() as w:
        w.write({"id": "only"})
    assert list(f.iter_records()) == [{"id": "only"}]


def test_failed_rewrite_keeps_previous_version(root: Root) -> None:
    f = JsonlFile(root.uri("a.jsonl"), storage_options=root.storage_options)
    with f.writer_sync() as w:
        w.write({"id": "v1"})
    with pytest.raises(RuntimeError), f.writer_sync() as w:
        w.write({"id": "v2"})
        raise RuntimeError("crash")
    assert list(f.iter_records()) == [{"id": "v1"}]


def test_missing_file_is_file_not_found(root: Root) -> None:
    with pytest.raises(FileNotFoundError):
        list(JsonlFile(root.uri("nope.jsonl"), storage_options=root.storage_options).iter_records())


def test_truncated_zst_file_is_corruption_not_short_read(root: Root) -> None:
    f = JsonlFile(root.uri("t.jsonl.zst"), storage_options=root.storage_options)
    with f.writer_sync() as w:
        w.write_many({"id": i, "v": str(i) * 20} for i in range(20_000))
    data = f.loc.fs.cat_file(f.loc.path)
    f.loc.fs.pipe_file(f.loc.path, data[: len(data) - 100])
    with pytest.raises(CorruptFileError, match="truncated"):
        list(f.iter_records())


def test_non_serializable_record_names_the_problem(tmp_path: object) -> None:
    f = JsonlFile(f"{tmp_path}/x.jsonl")
    with pytest.raises(TypeError, match="not JSON-serializable"), f.writer_sync() as w:
        w.write({"id": 1, "bad": object()})
    assert not f.exists()


MESSY = (
    b'{"id": 1}\r\n'
    b"\n"
    b"   \n"
    b'{"id": 2, "bad utf8": "\xff\xfe"}\n'
    b"[1, 2, 3]\n"
    b'{"id": 3, broken\n'
    b'"just a string"\n'
    b'{"id": 4}'  # no final newline
)


def write_raw(root: Root, name: str, data: bytes) -> JsonlFile:
    f = JsonlFile(root.uri(name), storage_options=root.storage_options)
    f.loc.fs.makedirs(root.base, exist_ok=True)
    f.loc.fs.pipe_file(f.loc.path, data)
    return f


def test_on_error_raise_names_file_and_line(root: Root) -> None:
    f = write_raw(root, "messy.jsonl", MESSY)
    with pytest.raises(MalformedRecordError) as info:
        list(f.iter_records())
    assert info.value.line_no == 4
    assert "messy.jsonl, line 4" in str(info.value)
    assert "UTF-8" in info.value.reason


def test_on_error_skip_counts_every_line(root: Root) -> None:
    f = write_raw(root, "messy.jsonl", MESSY)
    reader = f.iter_records(on_error="skip")
    assert [r["id"] for r in reader] == [1, 4]
    s = reader.stats
    assert (s.lines, s.records, s.blank, s.skipped) == (8, 2, 2, 4)
    assert s.lines == s.records + s.blank + s.skipped + s.quarantined


def test_on_error_quarantine_writes_reject_rows(root: Root) -> None:
    f = write_raw(root, "messy.jsonl", MESSY)
    rejects = JsonlDir(root.uri("rejects"), storage_options=root.storage_options)
    with rejects.writer_sync() as sink:
        reader = f.iter_records(on_error="quarantine", rejects=sink)
        assert [r["id"] for r in reader] == [1, 4]
    rows = list(rejects.iter_records())
    assert [r["line_no"] for r in rows] == [4, 5, 6, 7]
    assert all(r["source"] == f.uri for r in rows)
    assert "UTF-8" in rows[0]["error"] and "raw_base64" in rows[0]  # raw bytes kept losslessly
    assert "list" in rows[1]["error"] and rows[1]["raw"] == "[1, 2, 3]"
    assert "invalid JSON" in rows[2]["error"]
    assert "str" in rows[3]["error"]
    assert reader.stats.quarantined == 4


def test_id_field_checked_when_asked(root: Root) -> None:
    f = write_raw(root, "ids.jsonl", b'{"id": "a"}\n{"x": 1}\n{"id": true}\n{"id": ""}\n{"id": 7}\n')
    reader = f.iter_records(on_error="skip", id_field="id")
    assert [r["id"] for r in reader] == ["a", 7]
    assert reader.stats.skipped == 3


def test_quarantine_without_sink_is_rejected() -> None:
    with pytest.raises(ValueError, match="rejects sink"):
        JsonlFile("/tmp/x.jsonl").iter_records(on_error="quarantine")


def test_bad_on_error_value() -> None:
    with pytest.raises(ValueError, match="on_error='drop'"):
        JsonlFile("/tmp/x.jsonl").iter_records(on_error="drop")


def test_strict_json_nan_is_malformed(root: Root) -> None:
    f = write_raw(root, "nan.jsonl", b'{"id": 1, "x": NaN}\n')
    with pytest.raises(MalformedRecordError, match="invalid JSON"):
        list(f.iter_records())


def test_written_lines_are_plain_jsonl(tmp_path: object) -> None:
    f = JsonlFile(f"{tmp_path}/plain.jsonl")
    with f.writer_sync() as w:
        w.write_many(RECORDS[:3])
    text = Path(f"{tmp_path}/plain.jsonl").read_text()
    assert [json.loads(line) for line in text.splitlines()] == RECORDS[:3]
    assert text.endswith("\n")
