"""Completion manifests: written after a job's outputs are committed, so storage tells a finished
job from a lost one even when the worker that ran it is gone.

A manifest's ``ids`` holds, per output file (:data:`ID_OUTPUTS`) and for ``input``, the count and
order-independent digest of the ids the job read and wrote (``{"count", "sum"}``, see
:class:`~airflow_batchinfer.storage.digest.IdDigest`): the round's close checks the invariant from
these, in O(shards), and opens only a shard whose digests disagree. The field is optional (schema
version 1 unchanged): a manifest written before it existed has none, and close then reads that
shard's files instead.

Judge, infer_judge and in-place manifests also carry ``reason_groups``: ``{group: rows}`` of the rows
the job rejected (in place: exhausted), by :func:`~airflow_batchinfer.review.reasons.reason_group`,
the 64 most common and ``(other)`` with the rest. Optional too: older manifests have none, and the
review page then reads that shard's rejected rows.
"""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.json_doc import read_json, write_json
from airflow_batchinfer.storage.location import StorageOptions, resolve

SCHEMA_VERSION = 1
# The output files whose ids a job of each kind digests (``ids[name]``), besides ``ids["input"]``.
# An in-place job's ``rejected`` file holds its exhausted rows (``max_attempts``, ``error``).
ID_OUTPUTS: dict[str, tuple[str, ...]] = {
    "infer": ("inferred",),
    "judge": ("approved", "rejected"),
    "infer_judge": ("approved", "rejected"),
    "in_place": ("approved", "rejected"),
}


def write_job_manifest(uri: str, data: dict[str, Any], storage_options: StorageOptions | None = None) -> None:
    write_json(resolve(uri, storage_options), data, schema_version=SCHEMA_VERSION)


def read_job_manifest(uri: str, storage_options: StorageOptions | None = None) -> dict[str, Any] | None:
    """The manifest, or ``None`` when the job has not completed. Unreadable ones are errors."""
    return read_json(
        resolve(uri, storage_options), schema_version=SCHEMA_VERSION, what="job manifest",
        remedy="delete it to rerun the job",
    )  # fmt: skip


def manifest_ids(doc: dict[str, Any] | None, name: str) -> IdDigest | None:
    """The digest a manifest (or an accepted doc) records for ``name`` (an output, or ``input``);
    ``None`` when it records none (written before digests existed)."""
    return IdDigest.maybe(((doc or {}).get("ids") or {}).get(name))
