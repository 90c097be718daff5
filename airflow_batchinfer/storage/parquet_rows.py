"""Parquet parts read in place: row groups planned from the footer alone, rows as JSON records.

A Parquet part's shards are whole row groups (:func:`row_groups` reads only the footer). Reading
one (:func:`parquet_blocks`) turns each row into the record its JSON object line would parse to,
the columns as its keys, in blocks of at most ``batch_rows`` rows
(:class:`~airflow_batchinfer.storage.validate.RowBlock`: each row converted to Python once, and
written as a line only where one is asked for): the blocks go through the same
:class:`~airflow_batchinfer.storage.validate.LineValidator` as a JSONL range's lines, which checks
the records unparsed, so ids, repeats, rejects and fan-outs work unchanged, and a block's position
is the row's number in the range. Values map to JSON as :data:`TYPE_MAP` says; a row holding a value
JSON cannot (a NaN, an infinity, a binary or duration value) comes as an :class:`UnreadableRow` in
its place, which the validator rejects with its reason.

pyarrow (the ``parquet`` extra) is imported on first use, so JSONL-only installs never need it.
"""

from __future__ import annotations

import datetime
import reprlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, BinaryIO

import orjson

from airflow_batchinfer.exceptions import ConfigError, CorruptFileError, StorageError
from airflow_batchinfer.storage.lines import RAW_PREFIX, BadLine, utf8_prefix
from airflow_batchinfer.storage.records import MAX_DEPTH
from airflow_batchinfer.storage.validate import RowBlock

# Parquet pages are read through a buffer of this many bytes per column, not a column chunk at once
# (pyarrow's default: a whole column chunk of a row group, ~1 GB for a wide 1 GB row group).
READ_BUFFER = 1024 * 1024

TYPE_MAP = {
    "null": "null",
    "bool": "true / false",
    "int8 … int64, uint8 … uint64": "number",
    "float, double (NaN, ±inf: the row is rejected)": "number",
    "decimal": "string (exact digits)",
    "string, large_string": "string",
    "date32, date64": 'string, ISO 8601 ("2024-05-01")',
    "time32, time64": 'string, ISO 8601 ("13:45:00.250000")',
    "timestamp": 'string, ISO 8601 ("2024-05-01T13:45:00+00:00"; no offset when it has no time zone)',
    "struct": "object",
    "list, large_list, fixed_size_list": "array",
    "map": "object (keys as strings)",
    "binary, fixed_size_binary, duration, interval": "refused: the row is rejected (cast the column)",
}
"""Parquet (Arrow) column types and the JSON values they become (the docs' table is this one)."""


class _NoJson:
    def __repr__(self) -> str:
        return "<no JSON form>"


_NO_JSON = _NoJson()  # a value in an unreadable row's description
_KEYS = orjson.OPT_NON_STR_KEYS  # a map's keys: written as strings
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxstring, _repr.maxother = 3, 12, 8, 120, 60


@dataclass(frozen=True)
class RowGroup:
    """One row group of a Parquet file, from its footer: ``bytes`` is its uncompressed size."""

    index: int
    rows: int
    bytes: int


class UnreadableRow(BadLine):
    """A Parquet row that no JSON line can hold: its value is a short description of the row (the
    reject row's ``raw``), :meth:`reason` says which column and the remedy."""

    _why: str

    def __new__(cls, description: str, why: str) -> UnreadableRow:
        text = utf8_prefix(description.encode("utf-8")[: RAW_PREFIX + 3])
        row = super().__new__(cls, text, len(text))
        row._why = why
        return row

    def reason(self) -> str:
        return self._why


def _pq() -> Any:
    """``pyarrow.parquet``, or the install command when the extra is missing."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - the extra is installed where tests run
        raise ConfigError(
            f"reading Parquet input needs pyarrow: pip install 'airflow-batchinfer[parquet]' ({exc})"
        ) from exc
    return pq


def _from_arrow(exc: BaseException) -> bool:
    """Whether ``exc`` is pyarrow's word on the bytes, not the stream's own I/O error, which pyarrow
    re-raises as it was (a network error is worth a retry, a damaged file is not), nor memory."""
    import pyarrow as pa

    if isinstance(exc, MemoryError):
        return False
    return isinstance(exc, pa.ArrowException) or type(exc) is OSError


def _unreadable(source: str, what: str, exc: BaseException) -> CorruptFileError:
    import pyarrow as pa

    if isinstance(exc, pa.ArrowNotImplementedError):  # e.g. a codec this pyarrow was built without
        remedy = "it uses a Parquet feature this pyarrow cannot read; rewrite it (snappy or zstd pages)"
    else:
        remedy = "the file is damaged or is not Parquet; regenerate it from its source"
    return CorruptFileError(f"{source}: {what} ({str(exc).strip()}): {remedy}, or remove it from the input.")


def _open(raw: BinaryIO, source: str) -> Any:
    """The ``ParquetFile`` of ``raw`` (its footer read: a few small reads at the end)."""
    pq = _pq()
    try:
        return pq.ParquetFile(raw, buffer_size=READ_BUFFER, pre_buffer=False)
    except Exception as exc:
        if not _from_arrow(exc):
            raise
        raise _unreadable(source, "not a readable Parquet file", exc) from exc


def row_groups(raw: BinaryIO, size: int, source: str) -> list[RowGroup]:
    """The row groups of the Parquet file ``raw`` (seekable, ``size`` bytes), from its footer alone."""
    if size < 12:  # "PAR1", the footer's length and "PAR1" again
        raise CorruptFileError(
            f"{source}: {size} bytes is too short for a Parquet file; regenerate it from its source, "
            "or remove it from the input."
        )
    meta = _open(raw, source).metadata
    return [
        RowGroup(i, meta.row_group(i).num_rows, meta.row_group(i).total_byte_size)
        for i in range(meta.num_row_groups)
    ]


def parquet_blocks(
    raw: BinaryIO, groups: tuple[int, int], *, source: str, batch_rows: int
) -> Iterator[RowBlock]:
    """The rows of row groups ``[a, b)`` of ``raw`` in order, in blocks of at most ``batch_rows``: one
    JSON object line per row (no newline), or an :class:`UnreadableRow` where a row has no JSON form.
    Each block is a :class:`~airflow_batchinfer.storage.validate.RowBlock`: its rows' records, which
    the validator checks as they are, its lines made only if asked (``lines()``). Memory is bounded
    by ``batch_rows`` rows (plus a page buffer per column), whatever the file's size."""
    first, end = groups
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    if first >= end:
        return
    pf = _open(raw, source)
    have = pf.metadata.num_row_groups
    if not 0 <= first < end <= have:
        raise StorageError(
            f"{source}: the shard names row groups [{first}, {end}) but the file has {have}: it changed "
            "since the run planned it. Restore the file, or start a new run over the new one."
        )
    rows = _Rows(pf.schema_arrow)
    batches = pf.iter_batches(batch_size=batch_rows, row_groups=range(first, end), use_threads=False)
    while True:
        try:
            batch = next(batches, None)
        except Exception as exc:
            if not _from_arrow(exc):
                raise
            raise _unreadable(source, f"row groups [{first}, {end}) cannot be read", exc) from exc
        if batch is None:
            return
        yield rows.block(batch)


def _default(value: Any) -> Any:
    """JSON for the values orjson does not write itself (``Decimal``; pandas' ``Timestamp``, which
    pyarrow returns for nanosecond timestamps where pandas is installed)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    raise TypeError(f"a {type(value).__name__} has no JSON form")


class _Rows:
    """One file's batches to blocks of records; what to check and convert per column is worked out
    once, from its schema."""

    def __init__(self, schema: Any) -> None:
        import pyarrow as pa

        self._names: list[str] = list(schema.names)
        self._types: list[Any] = list(schema.types)
        maps = any(_has(t, pa.types.is_map) for t in self._types)
        # maps as dicts (a repeated key: the row is unreadable); 6x slower to_pylist, so only with maps
        self._maps = "strict" if maps else None
        # Columns whose values are not JSON's as Python has them (a Decimal, a date, a map's int keys;
        # a nesting orjson refuses) go through orjson and back, as a JSON line's would; others are as is
        self._via_json = [
            name
            for name, typ in zip(self._names, self._types, strict=True)
            if not _native(typ) or _nesting(typ) >= MAX_DEPTH
        ]
        self._deep = 1 + max(map(_nesting, self._types), default=0) > MAX_DEPTH
        self._checks: list[tuple[int, Callable[[Any], Any], str]] = []
        for i, (name, typ) in enumerate(zip(self._names, self._types, strict=True)):
            if _has(typ, _refused):
                why = (
                    f"column {name!r} is {typ}, which a JSON record cannot hold; cast it to string "
                    "(or base64-encode it) before the run"
                )
                self._checks.append((i, _refused_values, why))
            if _has(typ, pa.types.is_floating):
                why = (
                    f"column {name!r} holds NaN or infinity, which JSON cannot represent; make it null "
                    "(or a string) before the run"
                )
                self._checks.append((i, _non_finite, why))

    def block(self, batch: Any) -> RowBlock:
        bad: dict[int, str] = {}
        for i, leaf, why in self._checks:
            for row in _rows_where(batch.column(i), leaf).to_pylist():
                bad.setdefault(row, why)
        try:
            rows: list[Any] = batch.to_pylist(maps_as_pydicts=self._maps)
        except (ValueError, KeyError, TypeError, OverflowError):  # some row's values have no Python form
            rows = [self._one(batch, i, bad.get(i)) for i in range(batch.num_rows)]
            return RowBlock(rows, deep=self._deep)
        for i, why in bad.items():
            rows[i] = UnreadableRow(_describe(rows[i]), why)
        if self._via_json:
            self._to_json(rows)
        return RowBlock(rows, deep=self._deep)

    def _to_json(self, rows: list[Any]) -> None:
        """The values of the ``_via_json`` columns of ``rows`` as JSON has them, in place, a column at
        a time; where one has no JSON form, row by row: such a row becomes an :class:`UnreadableRow`
        naming its first such column."""
        loads, dumps = orjson.loads, orjson.dumps
        try:
            columns = [
                loads(
                    dumps(
                        [r[name] if type(r) is dict else None for r in rows], default=_default, option=_KEYS
                    )
                )
                for name in self._via_json
            ]
        except orjson.JSONEncodeError:
            for i, row in enumerate(rows):
                if type(row) is dict:
                    rows[i] = self._json_row(row)
            return
        for name, values in zip(self._via_json, columns, strict=True):
            for row, value in zip(rows, values, strict=True):
                if type(row) is dict:
                    row[name] = value

    def _json_row(self, row: dict[str, Any]) -> dict[str, Any] | UnreadableRow:
        values = []
        for name in self._via_json:
            try:
                values.append(orjson.loads(orjson.dumps(row[name], default=_default, option=_KEYS)))
            except orjson.JSONEncodeError as exc:
                return UnreadableRow(_describe(row), self._no_json(name, exc))
        row.update(zip(self._via_json, values, strict=True))
        return row

    def _one(self, batch: Any, i: int, why: str | None) -> dict[str, Any] | UnreadableRow:
        """Row ``i`` alone, where its batch has no Python form as a whole (a map with a repeated
        key, a nanosecond timestamp without pandas to hold it)."""
        row: dict[str, Any] = {}
        for name, column in zip(self._names, batch.columns, strict=True):
            try:
                row[name] = column.slice(i, 1).to_pylist(maps_as_pydicts=self._maps)[0]
            except (ValueError, KeyError, TypeError, OverflowError) as exc:
                row[name] = _NO_JSON
                why = why or self._no_json(name, exc)
        return UnreadableRow(_describe(row), why) if why else self._json_row(row)

    def _no_json(self, name: str, exc: Exception) -> str:
        typ = self._types[self._names.index(name)]
        return f"column {name!r} ({typ}) holds a value with no JSON form ({exc}); cast it before the run"


def _describe(row: dict[str, Any]) -> str:
    """A short text of ``row`` for its reject (values cut: a row may hold megabytes)."""
    return _repr.repr(row)


def _native(typ: Any) -> bool:
    """Whether ``typ``'s Python values (``to_pylist``) are JSON's as they are: what ``orjson.loads``
    of their JSON would give back (bool, int, float, str, None, and lists and dicts of them)."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(typ):
        return _native(typ.value_type)
    if t.is_struct(typ) or t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ):
        return all(_native(typ.field(i).type) for i in range(typ.num_fields))
    return bool(
        t.is_null(typ)
        or t.is_boolean(typ)
        or t.is_integer(typ)
        or (t.is_floating(typ) and not t.is_float16(typ))
        or t.is_string(typ)
        or t.is_large_string(typ)
        or t.is_string_view(typ)
    )


def _nesting(typ: Any) -> int:
    """How many levels of objects and arrays a value of ``typ`` holds (0: a scalar)."""
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        return _nesting(typ.value_type)
    if pa.types.is_map(typ):
        return 1 + max(_nesting(typ.key_type), _nesting(typ.item_type))
    if typ.num_fields:
        return 1 + max(_nesting(typ.field(i).type) for i in range(typ.num_fields))
    return 1 if pa.types.is_struct(typ) else 0


def _refused(typ: Any) -> bool:
    import pyarrow as pa

    t = pa.types
    return bool(
        t.is_binary(typ)
        or t.is_large_binary(typ)
        or t.is_fixed_size_binary(typ)
        or t.is_binary_view(typ)
        or t.is_duration(typ)
        or t.is_interval(typ)
    )


def _has(typ: Any, pred: Callable[[Any], bool]) -> bool:
    """Whether ``typ`` or a type nested in it satisfies ``pred``."""
    import pyarrow as pa

    if pred(typ):
        return True
    if pa.types.is_dictionary(typ):
        return _has(typ.value_type, pred)
    if pa.types.is_map(typ):
        return _has(typ.key_type, pred) or _has(typ.item_type, pred)
    return any(_has(typ.field(i).type, pred) for i in range(typ.num_fields))


def _refused_values(arr: Any) -> Any:
    return arr.is_valid() if _refused(arr.type) else None


def _non_finite(arr: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_floating(arr.type):
        return None
    return pc.invert(pc.is_finite(arr))  # null where the value is: not flagged


def _rows_where(arr: Any, leaf: Callable[[Any], Any]) -> Any:
    """The indices into ``arr`` of the values holding a value ``leaf`` flags (``leaf(values)``: a
    boolean mask, or ``None`` for a type it does not check), found in Arrow however deep they are
    nested; an index may repeat."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = leaf(arr)
    if mask is not None:
        return pc.indices_nonzero(mask)
    typ = arr.type
    if pa.types.is_dictionary(typ):
        return _rows_where(arr.dictionary_decode(), leaf)
    if pa.types.is_struct(typ):  # flatten(): the fields with the struct's own nulls applied
        found = [_rows_where(field, leaf) for field in arr.flatten()]
        return pa.concat_arrays(found) if found else pa.array([], pa.uint64())
    if pa.types.is_map(typ):  # the list kernels do not take maps (pyarrow aborts): as a list of entries
        entries = pa.struct([typ.key_field, typ.item_field])
        return _rows_where(arr.cast(pa.list_(pa.field("entries", entries, nullable=False))), leaf)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        inner = _rows_where(pc.list_flatten(arr), leaf)
        return pc.take(pc.list_parent_indices(arr), inner).cast(pa.uint64())
    return pa.array([], pa.uint64())
