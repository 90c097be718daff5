"""The rows a Parquet run leaves pending, in Parquet beside its results: ``<run>/pending/``.

The run's own pending sets stay JSONL (each is what a round reads: ``round-NN/pending/``,
``round-NN/reviewed/``); a run with ``output_format: parquet`` that ends with rows pending gets them
as ``pending/<shard>.parquet`` too, one file per pending shard in the schema of ``results/``
(:mod:`~airflow_batchinfer.storage.parquet_schema`), so ``results/``, ``dropped/`` and ``pending/``
read as the run's whole outcome. The report rewrites it each time it is built (a resumed run's files
of shards no longer pending are removed); the id invariant counts the pending set itself, not this
copy.
"""

from __future__ import annotations

from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import files
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.parquet_columns import pinned
from airflow_batchinfer.storage.record_file import PARQUET_SUFFIX, record_file
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef


def export_final_pending(
    layout: RunLayout, pending: list[ShardRef | RangeRef], id_field: str, so: StorageOptions | None
) -> list[str]:
    """Write ``pending`` (the final pending set's shards) as Parquet files under ``<run>/pending/``
    and remove any other file there; returns the files written. Round 0's byte ranges (a run that
    never closed round 0: incomplete) are not copied: that input is the run's input file."""
    written = []
    inputs = pinned(layout.output_columns, so)
    for shard in pending:
        if isinstance(shard, RangeRef):
            continue
        dst = join(layout.final_pending, shard.shard_id + PARQUET_SUFFIX)
        source = record_file(shard.uri, storage_options=so)
        with record_file(dst, storage_options=so, id_field=id_field, inputs=inputs).writer_sync() as out:
            out.write_many(source.iter_records())
        written.append(dst)
    files.remove_others(layout.final_pending, "", set(written), so)
    return written
