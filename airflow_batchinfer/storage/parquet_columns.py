"""The input's columns in a run's Parquet output (``output_format: parquet``): decided once, from the
input, when the run is planned, and pinned in ``<run root>/output_columns.json``, so every output file
of every round has the same schema (:mod:`~airflow_batchinfer.storage.parquet_schema`).

How a column's type is decided:

- Parquet input: the first part's footer (the first file a round-0 shard reads), column by column:
  strings and the types whose values read as strings (dates, times, timestamps, decimals:
  ``parquet_rows.TYPE_MAP``) ``string``, integers ``int64``, floating point ``float64``, booleans
  ``bool``, anything else (structs, lists, maps) ``json``: a string column holding the value as
  JSON (nested Arrow types are not kept: a JSON value need not fit them, a JSON string always
  does). Another part's columns need not match: a value that does not fit its column stays in the
  row's ``record`` (lossless), so parts with another schema are neither refused nor unioned.
- JSONL input: the first records (at most :data:`SAMPLE_BYTES` of lines), field by field in the
  order first seen: a field whose non-null values are all strings, all integers, all floats or all
  booleans gets that type; nested values, mixed types or only nulls get ``json``.

Names the output's own columns hold (``id``, ``record``, the generation's fields) are not input
columns: those fields stay where they always were. A run planned before columns were pinned has no
such document: its files keep the fixed schema (no input columns).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage.json_doc import read_json, write_json
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.lines import BadLine
from airflow_batchinfer.storage.location import StorageOptions, resolve
from airflow_batchinfer.storage.parquet_schema import RESERVED, Kind, pyarrow

DOC_NAME = "output_columns.json"
DOC_VERSION = 1
SAMPLE_BYTES = 256 * 1024  # JSONL: the first records' bytes a decision reads at most
SAMPLE_RECORDS = 1000
_REMEDY = "delete it only with the run's output files (a new run decides its columns again)"


class Column(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    type: Kind


class OutputColumns(BaseModel):
    """The pinned document: the input columns, in order, and what they were decided from."""

    model_config = ConfigDict(extra="forbid")
    columns: list[Column]
    source: str

    def pairs(self) -> tuple[tuple[str, Kind], ...]:
        return tuple((c.name, c.type) for c in self.columns)


def from_arrow(schema: Any) -> list[Column]:
    """The columns of a Parquet input whose footer's Arrow schema is ``schema``."""
    pa, _ = pyarrow()
    t = pa.types
    out: list[Column] = []
    for field in schema:
        if field.name in RESERVED or any(c.name == field.name for c in out):  # a repeated name: the first
            continue
        ty = field.type
        if t.is_string(ty) or t.is_large_string(ty) or t.is_string_view(ty) or _as_text(t, ty):
            kind: Kind = "string"
        elif t.is_boolean(ty):
            kind = "bool"
        elif t.is_integer(ty):
            kind = "int64"
        elif t.is_floating(ty):
            kind = "float64"
        else:
            kind = "json"
        out.append(Column(name=field.name, type=kind))
    return out


def _as_text(t: Any, ty: Any) -> bool:
    """Types whose rows' values are strings (``parquet_rows.TYPE_MAP``: ISO 8601, exact digits)."""
    return bool(t.is_decimal(ty) or t.is_date(ty) or t.is_time(ty) or t.is_timestamp(ty))


def _kind(value: Any) -> Kind | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    return "json"


def from_records(records: Iterable[Mapping[str, Any]]) -> list[Column]:
    """The columns of a JSONL input whose first records are ``records``."""
    seen: dict[str, set[Kind]] = {}
    for record in records:
        for name, value in record.items():
            kinds = seen.setdefault(name, set())
            if (kind := _kind(value)) is not None:
                kinds.add(kind)
    return [
        Column(name=name, type=next(iter(kinds)) if len(kinds) == 1 else "json")
        for name, kinds in seen.items()
        if name not in RESERVED
    ]


def _sample(uri: str, so: StorageOptions | None) -> Iterable[Mapping[str, Any]]:
    """The first records of the JSONL(.zst) file at ``uri``, at most :data:`SAMPLE_BYTES` of lines."""
    taken = 0
    for _, line in itertools.islice(JsonlFile(uri, storage_options=so).iter_lines(), SAMPLE_RECORDS):
        if taken >= SAMPLE_BYTES:
            return
        taken += len(line)
        if isinstance(line, BadLine) or not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # planning quarantines it; the decision reads the records
        if isinstance(record, dict):
            yield record


def decide(first_file: str, so: StorageOptions | None = None) -> OutputColumns:
    """The input columns of a run whose first shard starts with ``first_file`` (a Parquet part: its
    footer; else a JSONL(.zst) file: its first records)."""
    if first_file.lower().endswith(".parquet"):
        _, pq = pyarrow()
        loc = resolve(first_file, so)
        with loc.fs.open(loc.path, "rb") as raw:
            schema = pq.ParquetFile(raw).schema_arrow
        return OutputColumns(columns=from_arrow(schema), source=f"the Parquet footer of {loc.uri}")
    return OutputColumns(
        columns=from_records(_sample(first_file, so)), source=f"the first records of {first_file}"
    )


def write_columns(uri: str, doc: OutputColumns, so: StorageOptions | None = None) -> None:
    write_json(resolve(uri, so), doc.model_dump(mode="json"), schema_version=DOC_VERSION)


def read_columns(uri: str, so: StorageOptions | None = None) -> OutputColumns | None:
    """The pinned document at ``uri``, or ``None`` (a run planned before columns were pinned)."""
    loc = resolve(uri, so)
    data = read_json(loc, schema_version=DOC_VERSION, what="output columns", remedy=_REMEDY)
    if data is None:
        return None
    data.pop("schema_version", None)
    try:
        return OutputColumns.model_validate(data)
    except ValidationError as exc:
        why = exc.errors()[0]["msg"]
        raise StorageError(f"{loc.uri}: not an output columns document ({why}); {_REMEDY}") from exc


def pinned(uri: str, so: StorageOptions | None = None) -> Sequence[tuple[str, Kind]]:
    """The input columns pinned at ``uri`` (none: the fixed schema of a run planned before them)."""
    doc = read_columns(uri, so)
    return () if doc is None else doc.pairs()
