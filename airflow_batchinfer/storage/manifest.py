"""Output manifests: who owns a shard directory, for which inputs, and whether it is complete.

``shard_dataset`` and ``recompact`` write ``_manifest.json`` as ``in_progress`` before their first
shard and ``complete`` after their last. A re-run with the same fingerprint reuses a complete output
and redoes an interrupted one; a directory holding someone else's shards is never overwritten unless
asked.
"""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.exceptions import OutputExistsError
from airflow_batchinfer.storage.json_doc import read_json, write_json
from airflow_batchinfer.storage.jsonl_dir import JsonlDir

MANIFEST_NAME = "_manifest.json"
SCHEMA_VERSION = 1


def read_manifest(directory: JsonlDir) -> dict[str, Any] | None:
    return read_json(
        directory.loc.child(MANIFEST_NAME),
        schema_version=SCHEMA_VERSION,
        what="manifest",
        remedy="delete it to start over",
    )


def write_manifest(directory: JsonlDir, data: dict[str, Any]) -> None:
    write_json(directory.loc.child(MANIFEST_NAME), data, schema_version=SCHEMA_VERSION)


def claim_output(
    directory: JsonlDir,
    *,
    kind: str,
    fingerprint: dict[str, Any],
    overwrite: bool,
    reuse: bool = True,
) -> dict[str, Any] | None:
    """Prepare ``directory`` for a run of ``kind`` over ``fingerprint``.

    Returns the complete manifest of an identical earlier run (to reuse it, unless ``reuse=False``;
    ``overwrite`` does not prevent that: identical inputs make identical outputs), or ``None`` after
    clearing what an interrupted run, or (with ``overwrite``) anything else, left behind. Shards of
    any other writer are refused with :class:`OutputExistsError`.
    """
    manifest = read_manifest(directory)
    same = (
        manifest is not None and manifest.get("kind") == kind and manifest.get("fingerprint") == fingerprint
    )
    if same and reuse and manifest is not None and manifest.get("state") == "complete":
        return manifest
    existing = directory.shards()
    if existing and not same and not overwrite:
        if manifest:
            source = (manifest.get("fingerprint") or {}).get("source")
            owner = f"a {manifest.get('kind')} run over {source} with other inputs or settings"
        else:
            owner = "an unknown writer"
        raise OutputExistsError(
            f"{directory.uri} already holds {len(existing)} shards written by {owner}. Choose an empty "
            "destination, or pass overwrite=True (CLI: --overwrite) to replace them."
        )
    directory.delete_shards()
    write_manifest(directory, {"kind": kind, "state": "in_progress", "fingerprint": fingerprint})
    return None
