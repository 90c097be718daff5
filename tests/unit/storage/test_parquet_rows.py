"""Issue 38, item 2: Parquet rows read in place as JSON lines, validated as JSONL lines are.

Row groups are planned from the footer alone; a range of row groups is read in bounded blocks, one
JSON object line per row, through :class:`LineValidator`: ids, repeats and rejects (with the row's
number in the range) work as for a byte range, and a row with no JSON form is rejected with a reason
that names its column.
"""

from __future__ import annotations

import datetime
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batchinfer.exceptions import CorruptFileError, StorageError
from airflow_batchinfer.storage.lines import BadLine, OversizedLine
from airflow_batchinfer.storage.parquet_rows import (
    TYPE_MAP,
    RowGroup,
    UnreadableRow,
    parquet_blocks,
    row_groups,
)
from airflow_batchinfer.storage.reader import ErrorPolicy
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.storage.validate import LineValidator, RowBlock


class Sink:
    def __init__(self) -> None:
        self.rows: list[Record] = []

    def write(self, record: Record) -> None:
        self.rows.append(record)


class Counting(io.RawIOBase):
    """A seekable file that counts the bytes and calls read through it."""

    def __init__(self, data: bytes) -> None:
        self._f = io.BytesIO(data)
        self.bytes_read = 0
        self.reads = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        return self._f.tell()

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.bytes_read += len(data)
        self.reads += 1
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def parquet(table: pa.Table, row_group_size: int | None = None, compression: str = "snappy") -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size, compression=compression)
    return buf.getvalue()


def validate(
    data: bytes, groups: tuple[int, int], batch_rows: int = 2, **kw: Any
) -> tuple[list[Record], list[Record], LineValidator]:
    """The kept records and the reject rows of reading ``groups`` through a LineValidator."""
    sink = Sink()
    validator = LineValidator(ErrorPolicy("part.parquet", "quarantine", sink), id_field="id", **kw)
    kept: list[Record] = []
    for block in parquet_blocks(io.BytesIO(data), groups, source="part.parquet", batch_rows=batch_rows):
        assert len(block) <= batch_rows
        kept += validator.check_block(block)[2]
    return kept, sink.rows, validator


def test_row_groups_come_from_the_footer_alone() -> None:
    rows = 20_000
    table = pa.table({"id": range(rows), "prompt": [f"{i} " + "lorem ipsum " * 40 for i in range(rows)]})
    data = parquet(table, row_group_size=5_000, compression="none")
    raw = Counting(data)
    groups = row_groups(raw, len(data), "big.parquet")  # type: ignore[arg-type]
    assert [(g.index, g.rows) for g in groups] == [(0, 5000), (1, 5000), (2, 5000), (3, 5000)]
    meta = pq.read_metadata(io.BytesIO(data))
    assert [g.bytes for g in groups] == [meta.row_group(i).total_byte_size for i in range(4)]
    assert all(g.bytes > 100_000 for g in groups)
    assert raw.reads <= 4 and raw.bytes_read <= 64 * 1024 < len(data) // 100  # the footer, not the data


def test_a_file_of_zero_rows_reads_as_no_lines() -> None:
    data = parquet(pa.table({"id": pa.array([], pa.int64())}))
    groups = row_groups(io.BytesIO(data), len(data), "empty.parquet")
    assert sum(g.rows for g in groups) == 0
    blocks = parquet_blocks(io.BytesIO(data), (0, len(groups)), source="e", batch_rows=5)
    assert [line for block in blocks for line in block] == []


@pytest.mark.parametrize(
    "data",
    [b"", b"PAR1", b'{"id": 1}\n' * 100, b"PAR1" + b"\0" * 100 + b"PAR1"],
    ids=["empty", "magic only", "jsonl", "no footer"],
)
def test_a_file_that_is_not_parquet_is_corrupt_naming_it(data: bytes) -> None:
    with pytest.raises(CorruptFileError, match=r"s3://b/in/part-3\.parquet: .*regenerate it"):
        row_groups(io.BytesIO(data), len(data), "s3://b/in/part-3.parquet")


def test_a_damaged_footer_is_corrupt() -> None:
    data = parquet(pa.table({"id": range(100)}), row_group_size=10)
    damaged = data[:-60] + data[-8:]  # the footer's length still says where it starts
    with pytest.raises(CorruptFileError, match=r"part\.parquet: not a readable Parquet file"):
        row_groups(io.BytesIO(damaged), len(damaged), "part.parquet")


def test_a_damaged_row_group_fails_the_read_naming_file_and_groups() -> None:
    table = pa.table({"id": range(1000), "x": ["a" * 100] * 1000})
    data = parquet(table, row_group_size=100)
    damaged = data[:2000] + b"\0" * 3000 + data[5000:]
    assert len(row_groups(io.BytesIO(damaged), len(damaged), "p")) == 10  # the footer is intact
    with pytest.raises(CorruptFileError, match=r"part\.parquet: row groups \[0, 3\) cannot be read"):
        list(parquet_blocks(io.BytesIO(damaged), (0, 3), source="part.parquet", batch_rows=50))


def test_a_stream_error_is_not_called_corruption() -> None:
    class Down(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            raise ConnectionError("network down")

    with pytest.raises(ConnectionError):
        row_groups(Down(b"x" * 100), 100, "part.parquet")


def test_row_groups_beyond_the_file_say_it_changed() -> None:
    data = parquet(pa.table({"id": range(10)}), row_group_size=5)
    with pytest.raises(StorageError, match=r"row groups \[1, 3\) but the file has 2: it changed"):
        list(parquet_blocks(io.BytesIO(data), (1, 3), source="p", batch_rows=5))


def test_rows_of_a_range_in_order_in_bounded_blocks() -> None:
    data = parquet(pa.table({"id": range(100), "q": [f"q{i}" for i in range(100)]}), row_group_size=30)
    blocks = list(parquet_blocks(io.BytesIO(data), (1, 3), source="p", batch_rows=7))
    assert max(map(len, blocks)) == 7
    lines = [line for block in blocks for line in block.lines()]
    assert lines == [orjson.dumps({"id": i, "q": f"q{i}"}) for i in range(30, 90)]


def test_values_map_to_json() -> None:
    entry = pa.struct([("n", pa.int32()), ("tags", pa.list_(pa.string()))])
    table = pa.table(
        {
            "id": ["a", "b"],
            "ok": [True, None],
            "f": [1.5, -2.0],
            "u": pa.array([2**64 - 1, 0], pa.uint64()),
            "d": pa.array([Decimal("12345678901234567890.12"), Decimal("-0.10")], pa.decimal128(24, 2)),
            "day": pa.array([datetime.date(2024, 5, 1), None], pa.date32()),
            "at": pa.array([datetime.datetime(2024, 5, 1, 13, 45, 0, 250000)] * 2, pa.timestamp("us")),
            "utc": pa.array([1_714_571_100_000_000_001] * 2, pa.timestamp("ns", tz="UTC")),
            "t": pa.array([datetime.time(13, 45)] * 2, pa.time64("us")),
            "meta": pa.array([{"n": 1, "tags": ["x", "y"]}, None], entry),
            "scores": pa.array([[1.0, 2.5], []], pa.list_(pa.float32())),
            "m": pa.array([[(1, "one"), (2, "two")], None], pa.map_(pa.int64(), pa.string())),
            "cat": pa.array(["p", "p"]).dictionary_encode(),
        }
    )
    kept, rejects, _ = validate(parquet(table), (0, 1))
    assert rejects == []
    assert kept[0] == {
        "id": "a",
        "ok": True,
        "f": 1.5,
        "u": 2**64 - 1,
        "d": "12345678901234567890.12",
        "day": "2024-05-01",
        "at": "2024-05-01T13:45:00.250000",
        "utc": "2024-05-01T13:45:00.000000001+00:00",
        "t": "13:45:00",
        "meta": {"n": 1, "tags": ["x", "y"]},
        "scores": [1.0, 2.5],
        "m": {"1": "one", "2": "two"},
        "cat": "p",
    }
    assert kept[1]["ok"] is None and kept[1]["meta"] is None and kept[1]["m"] is None
    assert kept[1]["d"] == "-0.10" and kept[1]["scores"] == []


def test_bad_rows_are_rejected_with_their_row_number_and_reason() -> None:
    n = 10
    ids: list[Any] = [f"r{i}" for i in range(n)]
    ids[1] = None  # no id
    ids[3] = "x" * 300  # longer than max_id_bytes
    ids[5] = "r4"  # a repeat
    floats = [0.5] * n
    floats[6] = float("nan")
    floats[7] = float("-inf")
    nested: list[Any] = [{"v": [1.0]}] * n
    nested[8] = {"v": [2.0, float("inf")]}
    blobs: list[Any] = [None] * n
    blobs[9] = b"\x00\xff"
    table = pa.table(
        {
            "id": ids,
            "x": floats,
            "deep": pa.array(nested, pa.struct([("v", pa.list_(pa.float64()))])),
            "blob": pa.array(blobs, pa.binary()),
        }
    )
    data = parquet(table, row_group_size=4)
    kept, rejects, validator = validate(data, (0, 3), batch_rows=3, max_id_bytes=256)
    assert [r["id"] for r in kept] == ["r0", "r2", "r4"]
    why = {r["line_no"]: r["error"] for r in rejects}
    assert sorted(why) == [2, 4, 6, 7, 8, 9, 10]  # 1-based rows of the range
    assert "id" in why[2]
    assert "max_id_bytes=256" in why[4]
    assert "duplicate id 'r4' (first at line 5)" in why[6]
    assert "column 'x' holds NaN or infinity" in why[7] and "column 'x'" in why[8]
    assert "column 'deep' holds NaN or infinity" in why[9]
    assert "column 'blob' is binary" in why[10] and "cast it to string (or base64-encode it)" in why[10]
    assert all(r["source"] == "part.parquet" for r in rejects)
    raw = {r["line_no"]: r["raw"] for r in rejects}
    assert "'x': nan" in raw[7] and "b'\\x00\\xff'" in raw[10]
    assert validator.stats.lines == n and validator.stats.records == 3
    assert validator.stats.quarantined == 7


def test_unreadable_rows_keep_offsets_counting() -> None:
    """A range reader tracks byte offsets; a Parquet range's mean nothing, but must not break."""
    table = pa.table({"id": ["a", "b", "c"], "x": [1.0, float("nan"), 2.0]})
    kept, rejects, validator = validate(parquet(table), (0, 1), offsets=True)
    assert [r["id"] for r in kept] == ["a", "c"]
    assert rejects[0]["line_in_range"] == 2 and rejects[0]["offset"] > 0
    assert validator.offset > rejects[0]["offset"]


def test_a_map_with_a_repeated_key_is_unreadable_alone() -> None:
    maps = pa.array([[("k", 1)], [("k", 1), ("k", 2)], [("j", 3)]], pa.map_(pa.string(), pa.int64()))
    table = pa.table({"id": [1, 2, 3], "m": maps})
    kept, rejects, _ = validate(parquet(table), (0, 1), batch_rows=10)
    assert [r["m"] for r in kept] == [{"k": 1}, {"j": 3}]
    assert rejects[0]["line_no"] == 2 and "column 'm'" in rejects[0]["error"]


def test_durations_are_refused_naming_the_column() -> None:
    table = pa.table({"id": [1, 2], "took": pa.array([5, None], pa.duration("s"))})
    kept, rejects, _ = validate(parquet(table), (0, 1))
    assert [r["id"] for r in kept] == [2]
    assert "column 'took' is duration[s]" in rejects[0]["error"]


def test_bad_lines_share_one_base() -> None:
    row = UnreadableRow("{'id': 1, 'x': nan}" + "y" * 5000, "column 'x' holds NaN")
    assert isinstance(row, BadLine) and row.reason() == "column 'x' holds NaN"
    assert len(row) == row.size <= 1024 and row.startswith(b"{'id': 1")
    assert isinstance(OversizedLine(b"x" * 10, 10, 5), BadLine)
    assert RowGroup(0, 10, 100) == RowGroup(0, 10, 100)


def test_a_path_on_disk_reads_as_an_open_file(tmp_path: Path) -> None:
    path = tmp_path / "part-00000.parquet"
    pq.write_table(pa.table({"id": range(5)}), path, row_group_size=2)
    with path.open("rb") as raw:
        groups = row_groups(raw, path.stat().st_size, str(path))
        blocks = list(parquet_blocks(raw, (0, len(groups)), source="p", batch_rows=2))
    lines = [line for block in blocks for line in block.lines()]
    assert [g.rows for g in groups] == [2, 2, 1]
    assert lines == [orjson.dumps({"id": i}) for i in range(5)]


def test_nan_in_a_map_or_a_list_of_structs_is_found() -> None:
    maps = pa.array([[("a", 1.0)], [("b", float("nan"))], None], pa.map_(pa.string(), pa.float64()))
    items = pa.array(
        [[{"s": 1.0}], [], [{"s": 2.0}, {"s": float("inf")}]], pa.list_(pa.struct([("s", pa.float64())]))
    )
    table = pa.table({"id": [1, 2, 3], "m": maps, "items": items})
    kept, rejects, _ = validate(parquet(table), (0, 1), batch_rows=10)
    assert [r["id"] for r in kept] == [1]
    assert {r["line_no"]: r["error"].split(" holds")[0] for r in rejects} == {
        2: "column 'm'",
        3: "column 'items'",
    }


def test_the_docs_type_table_is_the_codes() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "concepts.md").read_text()
    for parquet_type, json_value in TYPE_MAP.items():
        assert f"| {parquet_type} | {json_value} |" in docs


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (pa.ArrowNotImplementedError("Support for codec 'lzo' not built"), CorruptFileError),
        (pa.ArrowMemoryError("malloc of size 1 failed"), MemoryError),
    ],
    ids=["unsupported codec", "out of memory"],
)
def test_what_pyarrow_cannot_do_is_said_as_such(
    monkeypatch: pytest.MonkeyPatch, error: Exception, expected: type[Exception]
) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise error

    monkeypatch.setattr(pq, "ParquetFile", refuse)
    with pytest.raises(expected) as raised:
        row_groups(io.BytesIO(b"x" * 100), 100, "part.parquet")
    if expected is CorruptFileError:
        assert "a Parquet feature this pyarrow cannot read" in str(raised.value)
        assert "codec 'lzo'" in str(raised.value)


def test_a_wide_row_group_is_read_a_page_at_a_time() -> None:
    """The file's bytes come through Python (``raw.read``): with the page buffer the reader asks for
    about a MiB at a time; without it a column chunk, the whole row group's text, is one read."""
    rows, width = 240, 100_000
    text = "".join(chr(97 + i % 26) * 1000 for i in range(width // 1000))
    table = pa.table({"id": range(rows), "text": [f"{i:06d}{text}" for i in range(rows)]})
    buf = io.BytesIO()  # ~1 MiB pages (pyarrow checks the bound every write_batch_size values)
    pq.write_table(table, buf, compression="none", write_batch_size=8, row_group_size=rows)
    data = buf.getvalue()
    assert len(data) > rows * width  # one row group of 24 MB

    class Largest(io.BytesIO):
        largest = 0

        def read(self, n: int | None = -1) -> bytes:
            out = super().read(n)
            self.largest = max(self.largest, len(out))
            return out

    raw = Largest(data)
    seen = 0
    for block in parquet_blocks(raw, (0, 1), source="wide.parquet", batch_rows=4):
        assert len(block) <= 4
        seen += len(block)
    assert seen == rows
    assert raw.largest <= 2 * 1024 * 1024 < len(data) // 10


def mixed_table(n: int = 40) -> pa.Table:
    """Good rows and every kind of bad one, in columns that convert as they are and ones that go
    through JSON (a decimal, a timestamp, a map with int keys)."""
    ids: list[Any] = [f"r{i}" for i in range(n)]
    ids[1], ids[3], ids[5], ids[12] = None, "x" * 300, "r4", ""
    floats = [i / 4 for i in range(n)]
    floats[6], floats[30] = float("nan"), float("inf")
    entry = pa.struct([("n", pa.int32()), ("d", pa.decimal128(10, 2)), ("tags", pa.list_(pa.string()))])
    return pa.table(
        {
            "id": ids,
            "x": floats,
            "meta": pa.array(
                [{"n": i, "d": Decimal(i) / 4, "tags": ["t"] * (i % 3)} if i % 4 else None for i in range(n)],
                entry,
            ),
            "at": pa.array([1_714_571_100_000_000_001 + i for i in range(n)], pa.timestamp("ns", tz="UTC")),
            "m": pa.array(
                [[(i, "a"), (7, "b")] if i % 5 else None for i in range(n)], pa.map_(pa.int64(), pa.string())
            ),
            "blob": pa.array([b"\x00\xff" if i == 9 else None for i in range(n)], pa.binary()),
            "cat": pa.array([("p", "q")[i % 2] for i in range(n)]).dictionary_encode(),
        }
    )


@pytest.mark.parametrize(
    "kw", [{}, {"assign": lambda line, offset: f"a{line}"}, {"window": 4}], ids=["plain", "assign", "window"]
)
def test_rows_come_parsed_and_are_checked_as_their_lines_are(kw: dict[str, Any]) -> None:
    """A mixed good/bad file: its blocks (records, unparsed) and the same rows as JSON lines give
    the validator the same records, ids, stats and reject rows (row number, reason, raw)."""
    data = parquet(mixed_table(), row_group_size=16)
    by_rows, by_lines = Sink(), Sink()
    rows = LineValidator(ErrorPolicy("p", "quarantine", by_rows), id_field="id", max_id_bytes=256, **kw)
    lines = LineValidator(ErrorPolicy("p", "quarantine", by_lines), id_field="id", max_id_bytes=256, **kw)
    kept: list[Record] = []
    for block in parquet_blocks(io.BytesIO(data), (0, 3), source="p", batch_rows=7):
        assert isinstance(block, RowBlock)
        as_lines = block.lines()  # each row's JSON line, as a JSONL range would hold it
        assert type(as_lines[0]) in (bytes, UnreadableRow)
        good, ids, records = rows.check_block(block)
        assert (good.lines(), ids, records) == lines.check_block(as_lines)
        kept += records
    assert by_rows.rows == by_lines.rows
    assert vars(rows.stats) == vars(lines.stats)
    why = {r["line_no"]: r["error"].split(",")[0] for r in by_rows.rows}
    assert sorted(why) == ([4, 6, 7, 8, 10, 13, 31] if "assign" in kw else [2, 4, 6, 7, 8, 10, 13, 31])
    by_id = {r["id"]: r for r in kept}
    assert by_id["r0"]["meta"] is None and by_id["r2"]["meta"] == {"n": 2, "d": "0.50", "tags": ["t", "t"]}
    assert by_id["r2"]["at"] == "2024-05-01T13:45:00.000000003+00:00" and by_id["r2"]["m"] == {
        "2": "a",
        "7": "b",
    }


def test_a_block_of_good_rows_is_never_written_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of JSON-native columns are converted once (``to_pylist``): no line is made of a kept
    row, only of a rejected one (its reject's ``raw``) or when the block is read as a list."""
    from airflow_batchinfer.storage import validate

    made: list[Record] = []

    def dumps(record: Record) -> bytes:
        made.append(record)
        return orjson.dumps(record)

    monkeypatch.setattr(validate, "dumps", dumps)
    monkeypatch.setattr(orjson, "loads", None)  # nothing is parsed either
    ids = [f"q{i}" for i in range(500)]
    ids[100] = "q7"
    table = pa.table({"id": ids, "p": ["lorem"] * 500, "n": range(500), "f": [0.5] * 500})
    kept, rejects, _ = validate_rows(parquet(table))
    assert len(kept) == 499 and [r["line_no"] for r in rejects] == [101]
    assert made == [{"id": "q7", "p": "lorem", "n": 100, "f": 0.5}]
    assert rejects[0]["raw"] == '{"id":"q7","p":"lorem","n":100,"f":0.5}'


def validate_rows(data: bytes) -> tuple[list[Record], list[Record], list[RowBlock]]:
    sink = Sink()
    validator = LineValidator(ErrorPolicy("p", "quarantine", sink), id_field="id")
    kept: list[Record] = []
    goods: list[RowBlock] = []
    for block in parquet_blocks(io.BytesIO(data), (0, 1), source="p", batch_rows=128):
        good, _, records = validator.check_block(block)
        assert isinstance(good, RowBlock)
        goods.append(good)
        kept += records
    return kept, sink.rows, goods


def test_a_row_block_reads_as_its_lines() -> None:
    """What a reader that wants lines gets (e.g. sniffing the id field): the rows' JSON lines, made
    when asked, the kept ones' too; a block is not a list, so no reader takes it for its lines."""
    table = pa.table({"id": [1, 2, 2], "x": [0.5, float("nan"), 1.0]})
    block = next(parquet_blocks(io.BytesIO(parquet(table)), (0, 1), source="p", batch_rows=10))
    assert isinstance(block, RowBlock) and len(block) == 3 and len(block.records) == 3
    lines = block.lines()
    assert lines[0] == b'{"id":1,"x":0.5}' and isinstance(lines[1], UnreadableRow)
    assert lines[2] == b'{"id":2,"x":1.0}' and not isinstance(block, list)
    _, _, goods = validate_rows(parquet(table))
    assert [good.lines() for good in goods] == [[b'{"id":1,"x":0.5}', b'{"id":2,"x":1.0}']]


def test_a_value_with_no_json_form_makes_its_row_unreadable_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns are made JSON's a column at a time; where one value cannot be, row by row."""
    from airflow_batchinfer.storage import parquet_rows

    default = parquet_rows._default

    def refuse_13(value: Any) -> Any:
        if value == 13:
            raise TypeError("13 has no JSON form here")
        return default(value)

    monkeypatch.setattr(parquet_rows, "_default", refuse_13)
    table = pa.table({"id": range(20), "d": pa.array([Decimal(i) for i in range(20)], pa.decimal128(5, 0))})
    kept, rejects, _ = validate(parquet(table), (0, 1), batch_rows=10)
    assert [r["d"] for r in kept] == [str(i) for i in range(20) if i != 13]
    assert [r["line_no"] for r in rejects] == [14] and "column 'd' (decimal128(5, 0))" in rejects[0]["error"]
    assert rejects[0]["raw"] == "{'d': Decimal('13'), 'id': 13}"
