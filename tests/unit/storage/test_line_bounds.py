"""Issue 22, item 5 (storage side): input lines and ids have a bounded size.

A line longer than ``max_line_bytes`` goes to ``rejects/`` with its line number, its first KiB and
its length, and is never held whole while it is read: the splitter skips the rest of it chunk by
chunk (plain and zstd files, byte-range reads, the shard job's range reader). An id longer than
``max_id_bytes`` UTF-8 bytes makes its record malformed.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from airflow_batchinfer.exceptions import MalformedRecordError
from airflow_batchinfer.run.prepare import shard_input
from airflow_batchinfer.spec.settings import setting
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.storage.lines import (
    FEED_SIZE,
    MAX_LINE_BYTES,
    RAW_PREFIX,
    READ_SIZE,
    LineSplitter,
    OversizedLine,
    iter_chunks,
)
from airflow_batchinfer.storage.ranges import InputRange, RangeRecordReader, range_params, read_range
from airflow_batchinfer.storage.records import MAX_ID_BYTES, Record

pytestmark = pytest.mark.security

LIMIT = 64 * 1024
BIG = 3 * 1024 * 1024  # the oversized line: 48 times the limit, spanning many 64 KiB chunks


def rec(i: int) -> bytes:
    return orjson.dumps({"id": f"r{i}", "q": f"question {i}"})


def big_line(size: int = BIG) -> bytes:
    head = b'{"id":"big","q":"'
    return head + "é".encode() * ((size - len(head) - 2) // 2) + b'"}'


def dataset() -> tuple[bytes, bytes]:
    """Five lines, the third oversized; and that line."""
    big = big_line()
    return b"\n".join([rec(1), rec(2), big, rec(4), rec(5)]) + b"\n", big


class Sink:
    def __init__(self) -> None:
        self.rows: list[Record] = []

    def write(self, record: Record) -> None:
        self.rows.append(record)


def rejects_of(root: Path) -> list[Record]:
    return [r for f in JsonlDir(str(root / "rejects")).jsonl_files() for r in f.iter_records()]


def check_reject(row: Record, big: bytes, line_no_key: str = "line_no", line_no: int = 3) -> None:
    assert row[line_no_key] == line_no
    assert row["raw_bytes"] == len(big)
    assert len(row["raw"].encode()) <= RAW_PREFIX and big.startswith(row["raw"].encode())
    assert "max_line_bytes" in row["error"] and f"{len(big):,}" in row["error"]


# ---------------------------------------------------------------------------------- the splitter
def split(chunks: list[bytes], max_line: int | None, strip_cr: bool = True) -> tuple[list[bytes], int]:
    splitter = LineSplitter(max_line=max_line, strip_cr=strip_cr)
    return [line for block in splitter.blocks(iter(chunks)) for line in block], splitter.peak


def test_the_splitter_never_holds_more_than_the_limit_of_a_long_line() -> None:
    data, big = dataset()
    chunks = [data[i : i + READ_SIZE] for i in range(0, len(data), READ_SIZE)]
    lines, peak = split(chunks, LIMIT)
    assert peak <= LIMIT + READ_SIZE  # what it held of the 3 MiB line: bounded by the limit, not the line
    assert [bytes(x) for x in lines] == [rec(1), rec(2), big[: len(lines[2])], rec(4), rec(5)]
    assert type(lines[2]) is OversizedLine and lines[2].size == len(big) and len(lines[2]) <= RAW_PREFIX
    _, unbounded = split(chunks, None)  # the old behaviour: the line joined whole
    assert unbounded >= len(big) - READ_SIZE


@pytest.mark.parametrize("chunk", [1, 7, 100, 4096, READ_SIZE, 10**9])
@pytest.mark.parametrize("crlf", [False, True])
def test_oversized_lines_are_found_across_every_chunk_boundary(chunk: int, crlf: bool) -> None:
    """The same lines however the bytes are cut: a long line ending at a chunk edge, at a stream's
    end without a newline, several in a row, next to blank lines."""
    end = b"\r\n" if crlf else b"\n"
    wanted = [b"a" * 10, b"b" * 300, b"", b"c" * 100, b"d" * 101, b"e" * 250, b"f", b"g" * 400]
    data = end.join(wanted)
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    lines, peak = split(chunks, 100)
    # a line's size is its bytes up to its "\n": a CRLF line's "\r" counts
    sizes = [len(w) + (1 if crlf and i < len(wanted) - 1 else 0) for i, w in enumerate(wanted)]
    expected = [len(w) if n <= 100 else -n for w, n in zip(wanted, sizes, strict=True)]
    assert [len(x) if type(x) is bytes else -x.size for x in lines] == expected
    assert expected.count(-101 if crlf else 100) == 1  # the edge case itself is exercised
    assert peak <= 100 + min(chunk, len(data))


def test_a_zstd_line_of_one_repeated_byte_decodes_in_small_chunks() -> None:
    """Such a line compresses ~30,000:1: decoding 8 KiB of it at once made one 256 MiB chunk."""
    data = b'{"id":"x","q":"' + b"a" * (48 * 1024 * 1024) + b'"}\nnext\n'
    packed = zstandard.ZstdCompressor().compress(data)
    sizes = [len(c) for c in iter_chunks(io.BytesIO(packed), zstd=True, source="mem")]
    assert sum(sizes) == len(data)
    assert max(sizes) <= 2 * READ_SIZE  # handed out in pieces; one decoder call makes at most 8 MiB

    # what one decoder call may make, however compressible: FEED_SIZE stored bytes of 4-byte blocks
    largest = 0
    dobj = zstandard.ZstdDecompressor().decompressobj()
    for start in range(0, len(packed), FEED_SIZE):
        largest = max(largest, len(dobj.decompress(packed[start : start + FEED_SIZE])))
    assert 0 < largest <= FEED_SIZE // 4 * 128 * 1024 <= 8 * 1024 * 1024


# ---------------------------------------------------------------------------- sharding a file
def write_input(path: Path, data: bytes) -> None:
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if path.name.endswith(".zst") else data)


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.zst"])
def test_sharding_quarantines_an_oversized_line_and_numbers_the_next(tmp_path: Path, name: str) -> None:
    data, big = dataset()
    write_input(tmp_path / name, data)
    result = shard_dataset(str(tmp_path / name), str(tmp_path / "input"), max_line_bytes=LIMIT)
    assert result.counts == {"lines": 5, "records": 4, "blank": 0, "skipped": 0, "quarantined": 1}
    kept = [r["id"] for r in JsonlDir(str(tmp_path / "input")).iter_records()]
    assert kept == ["r1", "r2", "r4", "r5"]
    [row] = rejects_of(tmp_path)
    check_reject(row, big)


def test_a_line_within_the_limit_is_kept(tmp_path: Path) -> None:
    data, big = dataset()
    (tmp_path / "in.jsonl").write_bytes(data)
    result = shard_dataset(str(tmp_path / "in.jsonl"), str(tmp_path / "input"), max_line_bytes=len(big))
    assert result.counts["records"] == 5


def test_raise_names_the_source_line_size_and_setting(tmp_path: Path) -> None:
    data, big = dataset()
    (tmp_path / "in.jsonl").write_bytes(data)
    with pytest.raises(MalformedRecordError) as err:
        shard_dataset(str(tmp_path / "in.jsonl"), str(tmp_path / "input"), max_line_bytes=LIMIT,
                      on_error="raise")  # fmt: skip
    assert err.value.line_no == 3
    text = str(err.value)
    assert "in.jsonl, line 3" in text and f"{len(big):,} bytes" in text and "max_line_bytes" in text
    assert len(text) < 1000  # the message does not carry the line


def test_skip_counts_it_and_a_record_reader_goes_on(tmp_path: Path) -> None:
    data, _ = dataset()
    (tmp_path / "in.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    reader = JsonlFile(str(tmp_path / "in.jsonl.zst"), max_line_bytes=LIMIT).iter_records(on_error="skip")
    assert [r["id"] for r in reader] == ["r1", "r2", "r4", "r5"]
    assert reader.stats.skipped == 1 and reader.stats.lines == 5


# ------------------------------------------------------------------------------ byte-range reads
def frames(data: bytes, size: int) -> bytes:
    """A multi-frame zstd file, frames cut every ``size`` bytes (not at line ends, as pzstd does)."""
    cctx = zstandard.ZstdCompressor()
    return b"".join(cctx.compress(data[i : i + size]) for i in range(0, len(data), size))


def plan(tmp_path: Path, name: str, data: bytes, **kw: Any) -> list[Any]:
    from airflow_batchinfer.storage.range_plan import shard_ranges

    path = tmp_path / name
    path.write_bytes(frames(data, 1024 * 1024) if name.endswith(".zst") else data)
    planned = shard_ranges(str(path), str(tmp_path / "input"), records_per_shard=2, max_bytes_per_shard=10**9,
                           id_field="id", assign_ids=False, **kw)  # fmt: skip
    assert planned is not None
    return planned[0]


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.zst"])
def test_range_reads_reject_an_oversized_line_with_its_offset(tmp_path: Path, name: str) -> None:
    data, big = dataset()
    shards = plan(tmp_path, name, data, max_line_bytes=LIMIT)
    assert {s.max_line_bytes for s in shards} == {LIMIT}  # every reader of a range uses the plan's
    rows: list[Record] = []
    ids: list[str] = []
    lines = 0
    for shard in shards:
        sink = Sink()
        reader = read_range(shard, id_field="id", assign_ids=False, rejects=sink)
        ids += [r["id"] for r in reader]
        rows += [{**row, "line_no": lines + row["line_in_range"]} for row in sink.rows]
        lines += reader.stats.lines
    assert ids == ["r1", "r2", "r4", "r5"] and lines == 5
    [row] = rows
    check_reject(row, big)
    assert row["offset"] == data.index(big) or name.endswith(".zst")  # decoded offsets in zstd


def test_the_shard_jobs_range_reader_gets_the_bounds_from_its_params(tmp_path: Path) -> None:
    """The worker rebuilds the range from ``params["input_range"]``: the bounds travel with it."""
    data, big = dataset()
    shards = plan(tmp_path, "in.jsonl", data, max_line_bytes=LIMIT, max_id_bytes=64)
    at = data.index(big)
    [shard] = [s for s in shards if s.range[0] <= at < s.range[1]]
    params = json.loads(json.dumps(range_params(shard, id_field="id", assign_ids=False)))
    rng = InputRange.from_params(params["input_range"])
    assert (rng.max_line_bytes, rng.max_id_bytes) == (LIMIT, 64)
    sink = Sink()
    reader = RangeRecordReader(JsonlFile(shard.uri), rng, rejects=sink)
    list(reader)
    [row] = sink.rows
    check_reject(row, big, "line_in_range", data.count(b"\n", rng.start, at) + 1)
    assert row["offset"] == at - rng.start


def test_round_zero_shards_with_the_runs_bounds(tmp_path: Path) -> None:
    """The run's settings reach the plan (``shard_input``), so its jobs and its close use them."""
    data, _ = dataset()
    (tmp_path / "in.jsonl").write_bytes(data)
    cfg = RunConfig.of(
        input=str(tmp_path / "in.jsonl"), run_root=str(tmp_path / "run"), prompt_template="{{ q }}",
        judge={"type": "llm"}, records_per_shard=2, max_line_bytes=LIMIT, max_id_bytes=100,
    )  # fmt: skip
    result = shard_input(cfg, RunLayout(cfg.run_root), None)
    assert {(s.max_line_bytes, s.max_id_bytes) for s in result.shards} == {(LIMIT, 100)}


# -------------------------------------------------------------------------------------------- ids
def test_an_id_over_the_limit_is_a_malformed_record(tmp_path: Path) -> None:
    """UTF-8 bytes count, not characters: 300 × "é" is 300 characters but 600 bytes."""
    fits, over = "é" * 256, "é" * 300
    lines = [orjson.dumps({"id": i, "q": "x"}) for i in ("a", fits, over, "z" * (8 * 1024 * 1024))]
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    result = shard_dataset(str(tmp_path / "in.jsonl"), str(tmp_path / "input"))
    assert [r["id"] for r in JsonlDir(str(tmp_path / "input")).iter_records()] == ["a", fits]
    rows = rejects_of(tmp_path)
    assert [r["line_no"] for r in rows] == [3, 4] and result.counts["quarantined"] == 2
    assert "600 bytes" in rows[0]["error"] and "max_id_bytes=512" in rows[0]["error"]
    assert len(rows[1]["error"]) < 400  # names the id by its start, never whole


def test_a_record_reader_with_an_id_field_bounds_ids(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(orjson.dumps({"id": "x" * 100}) + b"\n")
    with pytest.raises(MalformedRecordError, match="max_id_bytes=64"):
        list(JsonlFile(str(tmp_path / "in.jsonl")).iter_records(id_field="id", max_id_bytes=64))


def test_the_bounds_are_settings_with_one_default() -> None:
    assert setting("max_line_bytes").default == MAX_LINE_BYTES == 16 * 1024 * 1024
    assert setting("max_id_bytes").default == MAX_ID_BYTES == 512
    assert setting("max_line_bytes").flag == "--max-line-bytes"
