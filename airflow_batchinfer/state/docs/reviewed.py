"""A round's pending set as reviewers' decisions left it: ``round-NN/reviewed/``'s manifest, written
by :func:`~airflow_batchinfer.review.apply.apply_decisions` once per round, whichever gate applied
them; the plan step reads its shards, the report what the decisions did (:class:`ReviewApplied`, also
the plan's ``reviewed``)."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.state.docs.io import Digest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.manifest import OutputManifest, read_manifest

# of what reviewers' decisions did (its own part: the split's manifest and the plan carry it)
APPLIED_VERSION: Final = 1


class ReviewApplied(BaseModel):
    """What round ``round``'s ``decisions`` did to the next round's pending set: ``counts`` by action
    (``accept``, ``retry``, ``drop``; ``approve``: spot checks that followed the judge, when there
    were some), the digests of the rows ``accepted`` into results and ``dropped``, of the undecided
    spot checks ``approved`` into results (only when there were some) and those per LoRA adapter."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = APPLIED_VERSION
    round: int
    decisions: int
    counts: dict[str, int]
    accepted: Digest
    dropped: Digest
    approved: Digest | None = None
    approved_by_adapter: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        """The stored form: ``approved`` and ``approved_by_adapter`` only when there are some."""
        return self.model_dump(mode="json", exclude_none=True)


def review_split(layout: RunLayout, r: int, so: StorageOptions | None) -> OutputManifest | None:
    """The manifest of round ``r``'s pending set as reviewers' decisions left it, once complete."""
    if r < 1:
        return None
    split = read_manifest(JsonlDir(layout.reviewed(r), storage_options=so))
    return split if split is not None and split.complete else None


def review_applied(layout: RunLayout, r: int, so: StorageOptions | None = None) -> ReviewApplied | None:
    """What reviewers' decisions did to round ``r``'s pending set (counts, accepted and dropped id
    digests), once per round whichever gate applied them; ``None`` when none did."""
    split = review_split(layout, r, so)
    if split is None or split.applied is None:
        return None
    try:
        return ReviewApplied.model_validate(split.applied)
    except ValidationError as exc:
        raise StorageError(
            f"{layout.reviewed(r)}/_manifest.json: not what reviewers' decisions did "
            f"({exc.errors()[0]['msg']}); delete it and answer the gate again"
        ) from exc
