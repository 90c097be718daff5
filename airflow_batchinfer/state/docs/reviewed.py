"""A round's pending set as reviewers' decisions left it: ``round-NN/reviewed/``'s manifest, written
by :func:`~airflow_batchinfer.review.apply.apply_decisions` once per round, whichever gate applied
them; the plan step reads its shards, the report what the decisions did."""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.manifest import OutputManifest, read_manifest


def review_split(layout: RunLayout, r: int, so: StorageOptions | None) -> OutputManifest | None:
    """The manifest of round ``r``'s pending set as reviewers' decisions left it, once complete."""
    if r < 1:
        return None
    split = read_manifest(JsonlDir(layout.reviewed(r), storage_options=so))
    return split if split is not None and split.complete else None


def review_applied(layout: RunLayout, r: int, so: StorageOptions | None = None) -> dict[str, Any] | None:
    """What reviewers' decisions did to round ``r``'s pending set (counts, accepted and dropped id
    digests), once per round whichever gate applied them; ``None`` when none did."""
    split = review_split(layout, r, so)
    return split.applied if split is not None else None
