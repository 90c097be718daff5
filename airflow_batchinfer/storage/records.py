"""One JSONL line to one record: strict JSON (RFC 8259) objects with a usable id.

Errors are returned as :class:`RecordError` reasons so callers apply their ``on_error`` policy; the
reject row keeps the raw bytes losslessly (``raw_base64`` when they are not UTF-8).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import orjson

from airflow_batchinfer.storage.lines import OversizedLine

OnError = Literal["raise", "skip", "quarantine"]
ON_ERROR_CHOICES: tuple[OnError, ...] = ("raise", "skip", "quarantine")
MAX_ID_BYTES = 512  # the max_id_bytes setting's default (spec/settings.py): UTF-8 bytes of an id as text
MIN_ID_BYTES = 32  # ... and its least value
# The most levels of objects and arrays a record may nest (the record itself is level 1). The JSON
# reader takes 1,023 but the writer (orjson.dumps) stops at 254, and a row is written where a record
# was read, some wrapped deeper (a desk page's sample holds it under ``record``): half of the
# writer's depth leaves them room, and no check that walks a record recursively runs out of stack.
MAX_DEPTH = 128

Record = dict[str, Any]


class RecordError(ValueError):
    """Why one line is not a usable record (internal: turned into a policy action by callers)."""


def check_on_error(on_error: str) -> OnError:
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error={on_error!r}: expected one of {', '.join(ON_ERROR_CHOICES)}")
    return on_error


def parse_record(line: bytes) -> Record:
    """Parse one non-blank line into a JSON object, or raise :class:`RecordError`."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise RecordError(f"not valid UTF-8 (byte {uexc.start})") from None
        raise RecordError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RecordError(f"expected a JSON object, got {type(value).__name__}")
    return value


def depth(value: Any) -> int:
    """How many levels of objects and arrays ``value`` nests (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, level = stack.pop()
        items = v.values() if type(v) is dict else v if type(v) is list else None
        if items is None:
            continue
        deepest = max(deepest, level)
        stack.extend((x, level + 1) for x in items if type(x) is dict or type(x) is list)
    return deepest


def check_depth(record: Record) -> None:
    """:class:`RecordError` when ``record`` nests deeper than :data:`MAX_DEPTH`. (A line with at
    most that many ``{`` and ``[`` cannot: readers count them first, in C, and walk only the others.)"""
    levels = depth(record)
    if levels > MAX_DEPTH:
        raise RecordError(
            f"nested {levels} levels deep (objects and arrays), more than the {MAX_DEPTH} a record may "
            "have: its rows could not be written back as JSON; flatten the record (or store the deep "
            "part as a JSON string)"
        )


def id_text(value: str | int) -> str:
    """An id as text: how row ids (a fan-out's ``ID@ARM``), the review desk and its decisions and an
    in-place job's checkpoints name it. Two ids of one text (``1`` and ``"1"``) are one id: the
    reader rejects the later as a repeat, so every name derived from an id stays the id's alone."""
    return value if type(value) is str else str(value)


def record_id(record: Record, id_field: str, max_bytes: int | None = None) -> str | int:
    """The record's id, or :class:`RecordError` when it is missing, not a string/integer, or longer
    than ``max_bytes`` UTF-8 bytes as text (``None``: any length)."""
    value = record.get(id_field)
    if value is None:
        raise RecordError(f"missing id field {id_field!r}")
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise RecordError(
            f"id field {id_field!r} must be a non-empty string or an integer, got {_short(repr(value))}"
        )
    if max_bytes is not None and isinstance(value, str) and len(value) * 4 > max_bytes:  # else it fits
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise RecordError(id_too_long(id_field, size, max_bytes, value))
    return value


def id_too_long(id_field: str, size: int, max_bytes: int, start: str, *, at_least: bool = False) -> str:
    """Why an id of ``size`` UTF-8 bytes (``at_least``: or more) that starts with ``start`` is bad."""
    return (
        f"id field {id_field!r} is {'at least ' if at_least else ''}{size:,} bytes, longer than "
        f"max_id_bytes={max_bytes:,} (it starts {_short(repr(start[:80]))}); shorten the ids, or raise "
        "the max_id_bytes setting"
    )


def _short(text: str, n: int = 80) -> str:
    """``text`` cut to ``n`` characters for a message (an error must stay small whatever the id)."""
    return text if len(text) <= n else f"{text[:n]}…"


def reject_row(source: str, line_no: int, error: str, raw: bytes) -> Record:
    """The quarantine row ``{source, line_no, error, raw}`` (plus ``raw_base64`` for non-UTF-8). For
    an :class:`~airflow_batchinfer.storage.lines.OversizedLine`, ``raw`` is its first bytes and
    ``raw_bytes`` the whole line's length."""
    row: Record = {"source": source, "line_no": line_no, "error": error}
    if type(raw) is OversizedLine:
        row["raw_bytes"] = raw.size
    try:
        row["raw"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        row["raw"] = raw.decode("utf-8", errors="replace")
        row["raw_base64"] = base64.b64encode(raw).decode("ascii")
    return row


def dumps(record: Record) -> bytes:
    """Serialize one record as a JSON line body (no newline)."""
    return orjson.dumps(record)
