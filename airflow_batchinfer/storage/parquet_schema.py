"""The schema of the run's Parquet output files, and rows to and from it, losslessly.

Every output file of a run has the same schema, whatever its rows hold, so that a directory of them
(``results/*.parquet``) reads as one dataset in pyarrow, DuckDB and pandas:

====================  ========  ================================================================
column                type      holds
====================  ========  ================================================================
``id``                string    the row's id as text (the id field's value; an integer id written
                                out in decimal)
``record``            string    a JSON object: every field of the row that no column below holds:
                                the input record's fields (the id among them, with its own type)
                                and the generation's other fields (``candidates``, ``previous``...)
``result``            string    the generated text
``status``            string    ``approved``, ``rejected``, ``error``, ``max_attempts``...
``error``             string    why the generation failed (null: it did not)
``finish_reason``     string    the engine's finish reason
``judgment``          string    the judge's verdict as a JSON object (null: not judged)
``attempts``          int64     the attempts the row took
``round``             int64     the round that wrote it
``max_tokens``        int64     the generation's token cap
====================  ========  ================================================================

A field takes its column only when its value has the column's type (a string for a string column,
an integer for an int64 one, anything but null for ``judgment``); otherwise it stays in ``record``
(an input field named ``status`` holding a number, an ``error`` that is null). Reading a row back
merges ``record`` with the non-null columns, so the row read is the row written: the id invariant,
recompaction and the review read Parquet files as they read JSONL ones.

pyarrow is imported on first use: a run that writes no Parquet needs none.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any, Literal

import orjson

from airflow_batchinfer.exceptions import ConfigError, StorageError

Kind = Literal["str", "int", "json"]
ID_COLUMN = "id"
RECORD_COLUMN = "record"
#: The row's fields that have a column of their own, in the schema's order.
TYPED: tuple[tuple[str, Kind], ...] = (
    ("result", "str"),
    ("status", "str"),
    ("error", "str"),
    ("finish_reason", "str"),
    ("judgment", "json"),
    ("attempts", "int"),
    ("round", "int"),
    ("max_tokens", "int"),
)
COLUMNS = (ID_COLUMN, RECORD_COLUMN, *(name for name, _ in TYPED))
INSTALL = "pip install 'airflow-batchinfer[parquet]'"
_INT64 = (-(2**63), 2**63 - 1)


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


def schema() -> Any:
    """The one schema of every output file (a ``pyarrow.Schema``)."""
    pa, _ = pyarrow()
    types = {"str": pa.string(), "int": pa.int64(), "json": pa.string()}
    return pa.schema(
        [pa.field(ID_COLUMN, pa.string()), pa.field(RECORD_COLUMN, pa.string(), nullable=False)]
        + [pa.field(name, types[kind]) for name, kind in TYPED]
    )


def _fits(value: Any, kind: Kind) -> bool:
    if value is None:
        return False
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return type(value) is int and _INT64[0] <= value <= _INT64[1]
    return True


def _id_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if type(value) is int:
        return str(value)
    return None


class Columns:
    """Rows being gathered into columns, for one row group; ``bytes`` estimates their size."""

    def __init__(self, id_field: str) -> None:
        self.id_field = id_field
        self.data: dict[str, list[Any]] = {name: [] for name in COLUMNS}
        self.rows = 0
        self.bytes = 0

    def add(self, row: Mapping[str, Any]) -> None:
        rest = dict(row)
        size = 0
        for name, kind in TYPED:
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
        """The gathered rows as a ``pyarrow.Table`` of :func:`schema` (and the buffers emptied)."""
        pa, _ = pyarrow()
        out = pa.Table.from_pydict(self.data, schema=schema())
        self.data = {name: [] for name in COLUMNS}
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


def lines(batches: Iterable[Any]) -> Iterator[bytes]:
    """The rows of record batches of :func:`schema` as JSON lines (no newline), as they were written."""
    for batch in batches:
        cols = {name: batch.column(name).to_pylist() for name in (RECORD_COLUMN, *(n for n, _ in TYPED))}
        for i, record in enumerate(cols[RECORD_COLUMN]):
            row = orjson.loads(record)
            for name, kind in TYPED:
                value = cols[name][i]
                if value is not None:
                    row[name] = orjson.loads(value) if kind == "json" else value
            yield orjson.dumps(row)
