"""Input lines to records, the one way: sharding a file and reading a round-0 range shard both
validate here, so a bad line is rejected for the same reason whichever of the two reads it.

A line is blank (counted), or a JSON object with a usable id that this reader has not seen (kept),
or bad (``ErrorPolicy``: quarantined, skipped or raised): invalid JSON, non-UTF-8 bytes, a
non-object value, an object nested deeper than
:data:`~airflow_batchinfer.storage.records.MAX_DEPTH` levels (its rows could not be written back), a
missing or invalid id, an id longer than ``max_id_bytes`` (in a long line: found without parsing it,
:mod:`~airflow_batchinfer.storage.id_scan`), an OpenAI batch line without ``body``, a
repeated id (compared as text, :func:`~airflow_batchinfer.storage.records.id_text`: ``1`` and ``"1"``
are one id), a line its reader could not take (a :class:`~airflow_batchinfer.storage.lines.BadLine`:
a line longer than ``max_line_bytes``, which the splitter never held whole, or a Parquet row with no
JSON form), or, with a fan-out, a record that picks its
own adapter (:meth:`~airflow_batchinfer.storage.fan_out.FanOut.refusal`).

Rows that come parsed (a Parquet batch: a :class:`RowBlock`) go through the same checks, in the same
loop, unparsed and never serialized unless rejected (the reject row keeps the record's JSON line).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import orjson

from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.id_scan import SCAN_FROM, oversized_id
from airflow_batchinfer.storage.lines import BadLine
from airflow_batchinfer.storage.reader import ErrorPolicy
from airflow_batchinfer.storage.records import (
    MAX_DEPTH,
    MAX_ID_BYTES,
    Record,
    RecordError,
    check_depth,
    dumps,
    id_text,
    parse_record,
    record_id,
)

_DEEP_LINE = 2 * MAX_DEPTH + 1  # bytes a line needs to nest deeper than MAX_DEPTH ("[" and "]" each level)


class RowBlock:
    """Rows that come parsed (a Parquet batch's), which :meth:`LineValidator.check_block` checks
    without parsing them: ``records`` holds each row's record (JSON values only, as ``orjson.loads``
    would give them) or the :class:`~airflow_batchinfer.storage.lines.BadLine` in its place;
    ``deep``: a record may nest deeper than :data:`MAX_DEPTH` (its schema does), so each is walked.
    Not a list of lines: a reader that wants lines (e.g. to sniff an input's id field) asks
    :meth:`lines`, so none is serialized unasked."""

    __slots__ = ("deep", "records")

    def __init__(self, records: list[Any], *, deep: bool = False) -> None:
        self.records = records
        self.deep = deep

    def __len__(self) -> int:
        return len(self.records)

    def lines(self) -> list[bytes]:
        """The rows as JSON object lines (a bad row as it is)."""
        return [r if isinstance(r, BadLine) else dumps(r) for r in self.records]


AssignId = Callable[[int, int], str]
"""``assign(line_no, offset)``: the id given to a record without one (``assign_ids``)."""


def detect_id_field(record: dict[str, Any]) -> str:
    """``custom_id`` for an OpenAI batch input line (``custom_id`` + ``body``, no ``id``), else ``id``."""
    if "id" not in record and "custom_id" in record and "body" in record:
        return "custom_id"
    return "id"


def reason(line: bytes) -> str:
    """Why ``line`` (which ``orjson`` refused) is not a record."""
    try:
        parse_record(line)
    except RecordError as exc:
        return str(exc)
    return "invalid JSON"


def _as_text(key: str) -> str:
    """A repeat's hint where the two may differ in type (a number and its digits as a string)."""
    if key.lstrip("-").isdigit():
        return f': ids are compared as text, so {key} and "{key}" are one id; give each record its own'
    return ""


class LineValidator:
    """Validates blocks of raw lines in order, counting every line in ``policy.stats``.

    :param id_field: the id field; ``None`` detects it from the first record (:func:`detect_id_field`).
    :param assign: gives records without an id one (``assign_ids``); ``None`` rejects them.
    :param window: repeated ids are found among the last ``window`` to ``2 × window`` kept records
        (sharding: any two records of one shard meet); ``None``: among all records read.
    :param offsets: lines come with their ``\\r`` (``iter_line_blocks(strip_cr=False)``): the
        validator strips it and tracks each line's byte offset (a range shard's reject rows and
        assigned ids name it, as absolute line numbers are not known inside a range).
    :param max_id_bytes: the most UTF-8 bytes of a string id; ``None``: any length.
    :param fan_out: round 0's fan-out: a record it cannot fan out is bad (the caller fans out the
        kept records; the ids this validator returns and tracks are the input's).
    """

    def __init__(
        self,
        policy: ErrorPolicy,
        *,
        id_field: str | None,
        assign: AssignId | None = None,
        window: int | None = None,
        offsets: bool = False,
        max_id_bytes: int | None = MAX_ID_BYTES,
        fan_out: FanOut | None = None,
    ) -> None:
        self.policy = policy
        self.fan_out = fan_out
        self.stats = policy.stats
        self.id_field = id_field
        self._openai = id_field == "custom_id"
        self._max_id = max_id_bytes
        # A string id of at most this many characters fits in max_id_bytes whatever its characters
        # (UTF-8 takes at most 4 bytes each): the common path never encodes an id.
        self._id_chars = (max_id_bytes // 4) if max_id_bytes is not None else None
        self._assign = assign
        self._window = window
        self._offsets = offsets
        self._seen: dict[Any, int] = {}
        self._seen_before: dict[Any, int] = {}
        self.line_no = 0  # of the last line checked (1-based)
        self.offset = 0  # byte offset of the next line (with ``offsets``)

    @overload
    def check_block(self, block: RowBlock) -> tuple[RowBlock, list[Any], list[Record]]: ...
    @overload
    def check_block(self, block: list[bytes]) -> tuple[list[bytes], list[Any], list[Record]]: ...
    def check_block(
        self, block: list[bytes] | RowBlock
    ) -> tuple[list[bytes] | RowBlock, list[Any], list[Record]]:
        """The good lines of ``block`` (re-serialized where an id was assigned), their ids and
        records. The common path (a valid object with a fresh id) is a few C calls per line; every
        error path goes through the helpers that name what is wrong. A :class:`RowBlock`'s records
        are checked as they are, unparsed; its good lines are a :class:`RowBlock` of those kept."""
        good: list[bytes] = []
        ids: list[Any] = []
        records: list[Record] = []
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        stats, seen, offsets = self.stats, self._seen, self._offsets
        id_chars = self._id_chars
        rows: list[Any] | None = None
        deep = False
        lines: list[bytes] = []
        if isinstance(block, RowBlock):
            rows, deep = block.records, block.deep
        else:
            lines = block
        line = b""
        record: Any
        for item in lines if rows is None else rows:
            self.line_no += 1
            offset = self.offset
            if type(item) is not bytes and isinstance(item, BadLine):  # e.g. an OversizedLine
                self._bad_line(item, rows is None)
                continue
            if rows is None:  # a line: parsed here
                line = item
                if offsets:
                    self.offset += len(line) + 1
                    line = line[:-1] if line.endswith(b"\r") else line
                if len(line) > SCAN_FROM and (why := self._oversized_id(line)):  # refused unparsed
                    self._bad(line, offset, why)
                    continue
                try:
                    record = loads(line)
                except decode_error:
                    self._not_json(line, offset)
                    continue
            else:  # a row, parsed already: one unit of offset (it has no bytes of its own)
                record = item
                self.offset += 1
            try:
                if rows is None:
                    # a record nests no deeper than its line has "{" and "[" (and half its bytes):
                    # counted in C, so only a line that might is walked
                    if type(record) is not dict or (
                        len(line) > _DEEP_LINE and line.count(b"{") + line.count(b"[") > MAX_DEPTH
                    ):
                        self._shape(record, line)
                elif deep:  # a row whose schema nests deeper than a record may
                    check_depth(record)
                id_field = self.id_field if self.id_field is not None else self._detect(record)
                if self._openai and type(record.get("body")) is not dict:
                    raise RecordError("OpenAI batch line without a 'body' object")
                rid = record.get(id_field)
                if rid is None and self._assign is not None:
                    rid = record[id_field] = self._assign(self.line_no, offset)
                    line = dumps(record) if rows is None else line
                elif not (
                    (type(rid) is str and rid and (id_chars is None or len(rid) <= id_chars))
                    or type(rid) is int
                ):  # raises, naming what is wrong with the id (a long string id may still fit)
                    record_id(record, id_field, self._max_id)
                key = rid if type(rid) is str else str(rid)  # records.id_text: ids are unique as text
                if key in seen or key in self._seen_before:
                    first = seen.get(key) or self._seen_before.get(key)
                    raise RecordError(
                        f"duplicate id {rid!r} (first at line {self._line_name(first)}){_as_text(key)}"
                    )
                if self.fan_out is not None and (why := self.fan_out.refusal(record)):
                    raise RecordError(why)
            except RecordError as exc:
                self._bad(line if rows is None else dumps(record), offset, str(exc))
                continue
            seen[key] = self.line_no
            if self._window is not None and len(seen) >= self._window:
                self._seen_before, self._seen = seen, {}
                seen = self._seen
            if rows is None:
                good.append(line)
            ids.append(rid)
            records.append(record)
        stats.lines += len(block)
        stats.records += len(records)
        return (good if rows is None else RowBlock(records)), ids, records

    @staticmethod
    def _shape(record: Any, line: bytes) -> None:
        """Raises :class:`RecordError` where ``line``'s value is no object, or nests too deep."""
        if type(record) is not dict:
            parse_record(line)  # raises: not an object
        check_depth(record)

    def _detect(self, record: Record) -> str:
        """The id field, from the first record where not given."""
        self.id_field = detect_id_field(record)
        self._openai = self.id_field == "custom_id"
        return self.id_field

    def _bad_line(self, line: BadLine, sized: bool) -> None:
        """A line its reader could not take (a row: one unit of offset; a line: its bytes)."""
        offset = self.offset
        self.offset += line.size + 1 if sized else 1
        self._bad(line, offset, line.reason())

    def _not_json(self, line: bytes, offset: int) -> None:
        if not line or line.isspace():
            self.stats.blank += 1
        else:
            self._bad(line, offset, reason(line))

    def _oversized_id(self, line: bytes) -> str | None:
        if self.id_field is None or self._max_id is None:
            return None
        return oversized_id(line, self.id_field, self._max_id)

    def line_of(self, value: str | int) -> int:
        """The line of the kept record with id ``value`` (among the ids this validator still holds)."""
        key = id_text(value)
        return self._seen.get(key) or self._seen_before[key]

    def _line_name(self, line_no: int | None) -> str:
        return f"{line_no} of this range" if self._offsets else str(line_no)

    def _bad(self, line: bytes, offset: int, why: str) -> None:
        where = {"line_in_range": self.line_no, "offset": offset} if self._offsets else None
        self.policy.bad_line(self.line_no, line, why, where)
