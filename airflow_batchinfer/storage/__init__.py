"""Streaming JSONL shard storage on local disk, S3 or any fsspec filesystem.

Public API::

    JsonlFile, JsonlDir, ShardWriter, JsonlWriter, RecordReader, ReadStats,
    shard_dataset, ShardingResult, RecompactResult, ShardRef, RangeRef

(``recompact`` is :func:`airflow_batchinfer.storage.recompact.recompact`: the function's name is its
module's.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.storage.jsonl_dir import JsonlDir, Shard, ShardWriter
    from airflow_batchinfer.storage.jsonl_file import JsonlFile
    from airflow_batchinfer.storage.reader import ReadStats, RecordReader
    from airflow_batchinfer.storage.recompact import RecompactResult
    from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef
    from airflow_batchinfer.storage.sharding import ShardingResult, shard_dataset
    from airflow_batchinfer.storage.writer import JsonlWriter

__all__ = [
    "JsonlDir",
    "JsonlFile",
    "JsonlWriter",
    "RangeRef",
    "ReadStats",
    "RecompactResult",
    "RecordReader",
    "Shard",
    "ShardRef",
    "ShardWriter",
    "ShardingResult",
    "shard_dataset",
]
# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "jsonl_dir": ("JsonlDir", "Shard", "ShardWriter"),
        "jsonl_file": ("JsonlFile",),
        "reader": ("ReadStats", "RecordReader"),
        "recompact": ("RecompactResult",),
        "shard_ref": ("RangeRef", "ShardRef"),
        "sharding": ("ShardingResult", "shard_dataset"),
        "writer": ("JsonlWriter",),
    },
)
