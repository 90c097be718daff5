"""Completion manifests: written after a job's outputs are committed, so storage tells a finished
job from a lost one even when the worker that ran it is gone."""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.storage.json_doc import read_json, write_json
from airflow_batchinfer.storage.location import StorageOptions, resolve

SCHEMA_VERSION = 1


def write_job_manifest(uri: str, data: dict[str, Any], storage_options: StorageOptions | None = None) -> None:
    write_json(resolve(uri, storage_options), data, schema_version=SCHEMA_VERSION)


def read_job_manifest(uri: str, storage_options: StorageOptions | None = None) -> dict[str, Any] | None:
    """The manifest, or ``None`` when the job has not completed. Unreadable ones are errors."""
    return read_json(
        resolve(uri, storage_options), schema_version=SCHEMA_VERSION, what="job manifest",
        remedy="delete it to rerun the job",
    )  # fmt: skip
