"""Completion manifests: written after a job's outputs are committed, so storage tells a finished
job from a lost one even when the worker that ran it is gone."""

from __future__ import annotations

import json
from typing import Any, cast

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage.atomic import AtomicSink
from airflow_batchinfer.storage.location import StorageOptions, resolve

SCHEMA_VERSION = 1


def write_job_manifest(uri: str, data: dict[str, Any], storage_options: StorageOptions | None = None) -> None:
    sink = AtomicSink(resolve(uri, storage_options))
    try:
        sink.write(json.dumps({"schema_version": SCHEMA_VERSION, **data}, indent=2, default=str).encode())
    except BaseException:
        sink.abort()
        raise
    sink.commit()


def read_job_manifest(uri: str, storage_options: StorageOptions | None = None) -> dict[str, Any] | None:
    """The manifest, or ``None`` when the job has not completed. Unreadable ones are errors."""
    loc = resolve(uri, storage_options)
    try:
        with loc.fs.open(loc.path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise StorageError(f"{uri}: unreadable job manifest ({exc}); delete it to rerun the job") from exc
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise StorageError(
            f"{uri}: job manifest schema_version {version!r} is not supported (expected {SCHEMA_VERSION})"
        )
    return cast(dict[str, Any], data)
