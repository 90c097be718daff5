"""Small versioned JSON documents (manifests, summaries) stored atomically next to the data."""

from __future__ import annotations

import json
from typing import Any, cast

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage import confine
from airflow_batchinfer.storage.atomic import AtomicSink
from airflow_batchinfer.storage.location import Location


def write_json(loc: Location, data: Any, *, schema_version: int | None = None) -> None:
    """Write ``data`` (with ``schema_version`` first, when given) so it appears complete or not at all."""
    write_bytes(loc, encode_json(data, schema_version=schema_version))


def encode_json(data: Any, *, schema_version: int | None = None) -> bytes:
    """The stored form of ``data``: indented JSON, ``schema_version`` first when given."""
    doc = {"schema_version": schema_version, **data} if schema_version is not None else data
    return json.dumps(doc, indent=2, default=str).encode()


def write_bytes(loc: Location, payload: bytes) -> None:
    """Replace ``loc`` with ``payload`` atomically (a report, a plot)."""
    sink = AtomicSink(loc)
    try:
        sink.write(payload)
    except BaseException:
        sink.abort()
        raise
    sink.commit()


def read_json(loc: Location, *, schema_version: int, what: str, remedy: str) -> dict[str, Any] | None:
    """The document, or ``None`` if it does not exist. Unreadable documents and unknown schema
    versions are errors (a failed read is never reported as "not found")."""
    try:
        with loc.fs.open(loc.path, "rb") as f:
            confine.check_file(f, loc)  # a worker's job: checked once opened
            raw = f.read()
    except FileNotFoundError:
        return None
    return parse_json(loc, raw, schema_version=schema_version, what=what, remedy=remedy)


def parse_json(loc: Location, raw: bytes, *, schema_version: int, what: str, remedy: str) -> dict[str, Any]:
    """The document read from ``loc`` as ``raw`` bytes, checked as :func:`read_json` checks it."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StorageError(f"{loc.uri}: unreadable {what} ({exc}); {remedy}") from exc
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != schema_version:
        raise StorageError(
            f"{loc.uri}: {what} schema_version {version!r} is not supported (expected {schema_version}); "
            f"it was written by another version of airflow-batchinfer: use that version, or {remedy}"
        )
    return cast(dict[str, Any], data)
