"""The schema of the run's Parquet output files, and rows to and from it, losslessly.

Every output file of a run has the same schema, whatever its rows hold, so that a directory of them
(``results/*.parquet``) reads as one dataset in pyarrow, DuckDB and pandas (``select prompt from
'results/*.parquet'``):

====================  ========  ================================================================
column                type      holds
====================  ========  ================================================================
``id``                string    the row's id as text (the id field's value; an integer id written
                                out in decimal)
*the input's*         typed     the input's top-level fields, in the input's order, each typed as
*columns*                       the run pinned them when it was planned
                                (:mod:`~airflow_batchinfer.storage.parquet_columns`): ``string``,
                                ``int64``, ``float64``, ``bool``, or ``json`` (a string column
                                holding the value as JSON: nested values)
``result``            string    the generated text
``status``            string    ``approved``, ``rejected``, ``error``, ``max_attempts``...
``error``             string    why the generation failed (null: it did not)
``finish_reason``     string    the engine's finish reason
``judgment``          string    the judge's verdict as a JSON object (null: not judged)
``attempts``          int64     the attempts the row took
``round``             int64     the round that wrote it
``max_tokens``        int64     the generation's token cap
``record``            string    a JSON object, the overflow: every field of the row that no column
                                above holds (the id field, with its own type; a field not among
                                the input's columns; a value whose type is not its column's; the
                                generation's other fields, ``candidates``, ``previous``...)
====================  ========  ================================================================

A field takes its column only when its value has the column's type (a string for a string column,
an integer for an int64 one, a float for a float64 one, anything but null for a json one);
otherwise it stays in ``record`` (an input field that is a number in one row and text in another, a
null, an input field named ``status`` holding a number). Reading a row back merges ``record`` with
the non-null columns, so the row read is the row written: the id invariant, recompaction and the
review read Parquet files as they read JSONL ones. A json column is marked so in its field's
metadata (``batchinfer.kind: json``), which is how a reader tells it from a string column. Files of
a run planned before input columns were pinned have no input columns (``record`` second): they
read the same way.

pyarrow is imported on first use: a run that writes no Parquet needs none.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Literal

import orjson

from airflow_batchinfer.exceptions import ConfigError, StorageError

Kind = Literal["string", "int64", "float64", "bool", "json"]
ID_COLUMN = "id"
RECORD_COLUMN = "record"
#: The row's fields that have a column of their own, in the schema's order.
TYPED: tuple[tuple[str, Kind], ...] = (
    ("result", "string"),
    ("status", "string"),
    ("error", "string"),
    ("finish_reason", "string"),
    ("judgment", "json"),
    ("attempts", "int64"),
    ("round", "int64"),
    ("max_tokens", "int64"),
)
COLUMNS = (ID_COLUMN, RECORD_COLUMN, *(name for name, _ in TYPED))
#: Names no input column takes: the output's own columns hold them.
RESERVED = frozenset(COLUMNS)
KIND_KEY = b"batchinfer.kind"
INSTALL = "pip install 'airflow-batchinfer[parquet]'"
_INT64 = (-(2**63), 2**63 - 1)
Inputs = Sequence[tuple[str, Kind]]


def pyarrow() -> tuple[ModuleType, ModuleType]:
    """``pyarrow`` and ``pyarrow.parquet``, or a :class:`ConfigError` that says how to install them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError(
            f"output_format='parquet' needs pyarrow, which is not installed ({exc}): {INSTALL}, "
            "or set output_format='jsonl'"
        ) from exc
    return pa, pq


def _field(name: str, kind: Kind) -> Any:
    pa, _ = pyarrow()
    if kind == "json":
        return pa.field(name, pa.string(), metadata={KIND_KEY: b"json"})
    types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    return pa.field(name, types[kind])


def schema(inputs: Inputs = ()) -> Any:
    """The one schema of every output file of a run whose input columns are ``inputs`` (a
    ``pyarrow.Schema``; none: the fixed schema of a run planned before input columns)."""
    pa, _ = pyarrow()
    if not inputs:  # as such runs' files always were: record second
        fields = [pa.field(ID_COLUMN, pa.string()), pa.field(RECORD_COLUMN, pa.string(), nullable=False)]
        return pa.schema(fields + [_field(name, kind) for name, kind in TYPED])
    return pa.schema(
        [pa.field(ID_COLUMN, pa.string())]
        + [_field(name, kind) for name, kind in (*inputs, *TYPED)]
        + [pa.field(RECORD_COLUMN, pa.string(), nullable=False)]
    )


def _fits(value: Any, kind: Kind) -> bool:
    if value is None:
        return False
    if kind == "string":
        return isinstance(value, str)
    if kind == "int64":
        return type(value) is int and _INT64[0] <= value <= _INT64[1]
    if kind == "float64":
        return type(value) is float
    if kind == "bool":
        return type(value) is bool
    return True


def _id_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if type(value) is int:
        return str(value)
    return None


class Columns:
    """Rows being gathered into columns, for one row group; ``bytes`` estimates their size.
    ``inputs``: the run's input columns (:mod:`~airflow_batchinfer.storage.parquet_columns`)."""

    def __init__(self, id_field: str, inputs: Inputs = ()) -> None:
        self.id_field = id_field
        self.typed = (*((n, k) for n, k in inputs if n not in RESERVED), *TYPED)
        self.schema = schema(self.typed[: len(self.typed) - len(TYPED)])
        self.data: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        self.rows = 0
        self.bytes = 0

    def add(self, row: Mapping[str, Any]) -> None:
        rest = dict(row)
        size = 0
        for name, kind in self.typed:
            value = rest.get(name)
            if _fits(value, kind):
                del rest[name]
                if kind == "json":
                    value = _dumps(value, row)
                size += len(value) if isinstance(value, str) else 8
            else:
                value = None
            self.data[name].append(value)
        record = _dumps(rest, row)
        ident = _id_text(row.get(self.id_field))
        self.data[RECORD_COLUMN].append(record)
        self.data[ID_COLUMN].append(ident)
        self.rows += 1
        self.bytes += size + len(record) + len(ident or "")

    def table(self) -> Any:
        """The gathered rows as a ``pyarrow.Table`` of :attr:`schema` (and the buffers emptied)."""
        pa, _ = pyarrow()
        out = pa.Table.from_pydict(self.data, schema=self.schema)
        self.data = {name: [] for name in self.schema.names}
        self.rows = self.bytes = 0
        return out


def _dumps(value: Any, row: Mapping[str, Any]) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        raise TypeError(f"record is not JSON-serializable ({exc}): {str(row)[:200]}") from exc


def check_schema(found: Any, uri: str) -> None:
    """Refuse a Parquet file that is not one of a run's output files, naming it."""
    missing = [name for name in COLUMNS if name not in found.names]
    if missing:
        raise StorageError(
            f"{uri} is not a batchinfer output file: it has no column {', '.join(missing)} "
            f"(its columns: {', '.join(found.names)}); only files a run wrote are read here"
        )


def _json_columns(found: Any) -> set[str]:
    """The columns of schema ``found`` that hold JSON text: ``judgment`` and the marked ones."""
    marked = {f.name for f in found if f.metadata and f.metadata.get(KIND_KEY) == b"json"}
    return marked | {name for name, kind in TYPED if kind == "json"}


def lines(batches: Iterable[Any], found: Any) -> Iterator[bytes]:
    """The rows of record batches of a file of schema ``found`` (a run's output file) as JSON lines
    (no newline), as they were written."""
    names = [n for n in found.names if n not in (ID_COLUMN, RECORD_COLUMN)]
    json_cols = _json_columns(found)
    for batch in batches:
        cols = {name: batch.column(name).to_pylist() for name in (RECORD_COLUMN, *names)}
        for i, record in enumerate(cols[RECORD_COLUMN]):
            row = orjson.loads(record)
            for name in names:
                value = cols[name][i]
                if value is not None:
                    row[name] = orjson.loads(value) if name in json_cols else value
            yield orjson.dumps(row)
