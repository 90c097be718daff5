"""Streaming JSONL shard storage on local disk, S3 or any fsspec filesystem.

Public API::

    JsonlFile, JsonlDir, ShardWriter, JsonlWriter, RecordReader, ReadStats,
    shard_dataset, ShardingResult, recompact, RecompactResult, ShardDescriptor
"""

from __future__ import annotations

from airflow_batchinfer.storage.jsonl_dir import JsonlDir, Shard, ShardDescriptor, ShardWriter
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.reader import ReadStats, RecordReader
from airflow_batchinfer.storage.recompact import RecompactResult, recompact
from airflow_batchinfer.storage.sharding import ShardingResult, shard_dataset
from airflow_batchinfer.storage.writer import JsonlWriter

__all__ = [
    "JsonlDir",
    "JsonlFile",
    "JsonlWriter",
    "ReadStats",
    "RecompactResult",
    "RecordReader",
    "Shard",
    "ShardDescriptor",
    "ShardWriter",
    "ShardingResult",
    "recompact",
    "shard_dataset",
]
