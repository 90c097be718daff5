"""Issue 37, item 10: a line within ``max_line_bytes`` whose id is longer than ``max_id_bytes`` was
parsed whole before its id was refused (the record, its id as a ``str`` among the rest, held several
times the line's bytes). A long line is now scanned for its top-level id, which is measured where it
lies: the line is refused, for the same reason, without being parsed."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from airflow_batchinfer.storage.id_scan import SCAN_FROM, oversized_id
from airflow_batchinfer.storage.reader import ErrorPolicy, RecordReader
from airflow_batchinfer.storage.records import MAX_ID_BYTES, RecordError, parse_record, record_id
from airflow_batchinfer.storage.validate import LineValidator

pytestmark = pytest.mark.security

LINE_BYTES = 8 << 20


def peak_of(work: Callable[[], Any]) -> int:
    """The most bytes Python held at once during ``work`` beyond what it held before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def long_id_line() -> bytes:
    return orjson.dumps({"q": "what", "id": "x" * LINE_BYTES, "n": [1, 2]})


def test_the_validator_refuses_a_long_id_without_parsing_its_line() -> None:
    line = long_id_line()
    check = LineValidator(ErrorPolicy("in.jsonl", "skip"), id_field="id", max_id_bytes=MAX_ID_BYTES)
    peak = peak_of(lambda: check.check_block([line]))
    assert check.stats.skipped == 1 and check.stats.records == 0
    assert peak < len(line) // 8, f"{peak:,} bytes held for a {len(line):,}-byte line"  # parsed: > 1x


def test_the_record_reader_refuses_a_long_id_without_parsing_its_line() -> None:
    line = long_id_line()
    reader = RecordReader("in.jsonl", lambda: iter([(1, line)]), on_error="skip", id_field="id",
                          max_id_bytes=MAX_ID_BYTES)  # fmt: skip
    peak = peak_of(lambda: list(reader))
    assert reader.stats.skipped == 1
    assert peak < len(line) // 8, f"{peak:,} bytes held for a {len(line):,}-byte line"


def parsed_reason(line: bytes, id_field: str = "id") -> str | None:
    """What parsing the line whole says of its id (the reason for a short line)."""
    try:
        record_id(parse_record(line), id_field, MAX_ID_BYTES)
    except RecordError as exc:
        return str(exc)
    return None


PAD = "p" * SCAN_FROM  # makes a line long enough to be scanned
BIG = "x" * 600


@pytest.mark.parametrize(
    "record",
    [
        {"id": BIG, "q": PAD},
        {"q": PAD, "id": BIG},  # after a long field
        {"q": [PAD, {"a": "}]"}], "id": BIG},  # brackets in strings do not count
        {"id": "é" * 300, "q": PAD},  # 600 UTF-8 bytes
        {"id": "x" * (MAX_ID_BYTES + 1), "q": PAD},  # one byte over
    ],
)
def test_a_scanned_refusal_says_what_the_parse_says(record: dict[str, Any]) -> None:
    line = orjson.dumps(record)
    assert len(line) > SCAN_FROM
    why = oversized_id(line, "id", MAX_ID_BYTES)
    assert why is not None and why == parsed_reason(line)


@pytest.mark.parametrize(
    "line",
    [
        orjson.dumps({"id": 1, "meta": {"id": BIG}, "q": PAD}),  # a nested id is not the record's
        orjson.dumps({"id": 1, "q": f'"id": "{BIG}', "r": PAD}),  # text that looks like one
        orjson.dumps({"id": "x" * MAX_ID_BYTES, "q": PAD}),  # at the bound
        orjson.dumps({"id": "é" * 256, "q": PAD}),  # 512 UTF-8 bytes
        b'{"id": "' + b"\\u00e9" * 256 + b'", "q": "' + PAD.encode() + b'"}',  # escapes: 512 bytes
        orjson.dumps({"id": 10**18, "q": PAD}),
        orjson.dumps([{"id": BIG}, PAD]),  # not an object: the parse says so
        orjson.dumps({"id": BIG}),  # short: parsed as before
    ],
)
def test_lines_without_an_oversized_top_level_id_are_left_to_the_parse(line: bytes) -> None:
    assert oversized_id(line, "id", MAX_ID_BYTES) is None


def test_an_id_key_spelt_with_escapes_or_escaped_text_is_measured() -> None:
    line = b'{"\\u0069d": "' + BIG.encode() + b'", "q": "' + PAD.encode() + b'"}'
    assert oversized_id(line, "id", MAX_ID_BYTES) == parsed_reason(line)
    escaped = b'{"id": "' + b"\\u00e9" * 20_000 + b'", "q": "' + PAD.encode() + b'"}'  # 40,000 bytes
    why = oversized_id(escaped, "id", MAX_ID_BYTES)
    assert why is not None and why.startswith("id field 'id' is at least 20,000 bytes, longer than")
    openai = orjson.dumps({"custom_id": BIG, "body": {"messages": PAD}})
    assert oversized_id(openai, "custom_id", MAX_ID_BYTES) == parsed_reason(openai, "custom_id")
