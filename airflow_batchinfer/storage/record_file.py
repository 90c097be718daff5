"""A run's file of rows by its name: ``.parquet`` a Parquet output file, anything else JSONL(.zst).

The one place that tells the formats apart: readers and writers of a run's rows (results,
rejected, dropped, the review's and the report's readers) open files through :func:`record_file`
and stay the same for either format (``output_format``).
"""

from __future__ import annotations

import itertools
from typing import Literal

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.storage import files
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.location import Location, StorageOptions
from airflow_batchinfer.storage.parquet_out import ParquetOutFile
from airflow_batchinfer.storage.parquet_schema import Inputs

OutputFormat = Literal["jsonl", "parquet"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = ("jsonl", "parquet")
JSONL_SUFFIX = ".jsonl.zst"
PARQUET_SUFFIX = ".parquet"
RecordFile = JsonlFile | ParquetOutFile
BLOCK = 1024  # rows a conversion holds at a time


def is_parquet(name: str) -> bool:
    return name.lower().endswith(PARQUET_SUFFIX)


def output_suffix(output_format: str) -> str:
    """The name ending of a run's output files in ``output_format``."""
    if output_format not in OUTPUT_FORMATS:
        raise ConfigError(f"output_format {output_format!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
    return PARQUET_SUFFIX if output_format == "parquet" else JSONL_SUFFIX


def convert(
    src: str,
    dst: str,
    *,
    storage_options: StorageOptions | None = None,
    id_field: str = "id",
    inputs: Inputs = (),
) -> int:
    """Write the rows of ``src`` into ``dst`` in ``dst``'s format (atomically: all or nothing), then
    delete ``src``; returns the rows copied (``inputs``: the run's input columns, for a Parquet
    ``dst``). A ``src`` gone meanwhile (a concurrent promotion took
    it) raises :class:`FileNotFoundError` and leaves ``dst`` as it was."""
    copied = 0
    rows = iter(record_file(src, storage_options=storage_options).iter_records())
    dst_file = record_file(dst, storage_options=storage_options, id_field=id_field, inputs=inputs)
    with dst_file.writer_sync() as out:
        while block := list(itertools.islice(rows, BLOCK)):
            out.write_many(block)
            copied += len(block)
    files.remove(src, storage_options)
    return copied


def record_file(
    uri: str | Location,
    *,
    storage_options: StorageOptions | None = None,
    id_field: str = "id",
    inputs: Inputs = (),
) -> RecordFile:
    """The file at ``uri``, Parquet or JSONL by its name (when a Parquet file is written: ``id_field``,
    what its ``id`` column holds; ``inputs``, the run's pinned input columns,
    :func:`~airflow_batchinfer.storage.parquet_columns.pinned`)."""
    name = uri.path if isinstance(uri, Location) else uri
    if is_parquet(name):
        return ParquetOutFile(uri, storage_options=storage_options, id_field=id_field, inputs=inputs)
    return JsonlFile(uri, storage_options=storage_options)
