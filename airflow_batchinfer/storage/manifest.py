"""Output manifests (``_manifest.json``, :class:`OutputManifest`): who owns a shard directory, for
which inputs, and whether it is complete.

``shard_dataset``, ``recompact`` and the range plan write it as ``in_progress`` before their first
shard and ``complete`` after their last; a review's split of a pending set (``kind: review``) writes
it once, complete. A re-run with the same fingerprint reuses a complete output and redoes an
interrupted one; a directory holding someone else's shards is never overwritten unless asked.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from airflow_batchinfer.exceptions import OutputExistsError, StorageError
from airflow_batchinfer.storage.json_doc import read_json, write_json
from airflow_batchinfer.storage.jsonl_dir import JsonlDir
from airflow_batchinfer.storage.shard_ref import PLAN_KEYS, AnyRef, RangeRef, ShardRef

MANIFEST_NAME = "_manifest.json"
OUTPUT_MANIFEST_VERSION = 2  # 2: 0.1.0's one schema bump (typed, unknown fields refused)
_REMEDY = "delete it to start over"

OutputKind = Literal["shard", "shard-rejects", "recompact", "ranges", "review"]
OutputState = Literal["in_progress", "complete", "unsplittable"]


class OutputManifest(BaseModel):
    """A shard directory's manifest. ``fingerprint``: the source and settings the shards were made
    from (none: a review's split). ``shards`` with ``ids`` (the digest of each one's ids) and
    ``counts`` (sharding: ``lines``, ``records``, ``blank``, ``skipped``, ``quarantined``; a range
    plan: ``records`` estimated until round 0's close reads every range and fills them in).

    Sharding and range plans: ``id_field``, ``rejects_uri``; range plans: ``planning`` (bytes read,
    seconds) and ``taper_lanes``. Recompaction: ``records``, ``sources`` and ``ids`` (the digest of
    every id written). A review's split (``round-NN/reviewed/``): ``round``, ``reviewed_round``,
    ``decisions``, ``records`` (the rows retained) and ``applied``
    (:meth:`airflow_batchinfer.review.apply.Applied.to_dict`)."""

    model_config = ConfigDict(extra="forbid")
    kind: OutputKind
    state: OutputState
    fingerprint: dict[str, Any] | None = None
    shards: list[AnyRef] = Field(default_factory=list)
    counts: dict[str, int] | None = None
    id_field: str | None = None
    rejects_uri: str | None = None
    reused: bool = False
    records: int | None = None
    sources: int | None = None
    ids: dict[str, Any] | None = None
    planning: dict[str, float] | None = None
    taper_lanes: int | None = None
    round: int | None = None
    reviewed_round: int | None = None
    decisions: int | None = None
    applied: dict[str, Any] | None = None

    @field_validator("shards", mode="before")
    @classmethod
    def _refs_only(cls, shards: Any) -> Any:
        """Round 0's close once copied a range's plan keys (``spot_check_rate``, ``round``, ``slot``)
        here with its counts: a manifest holds the refs, so they are dropped on reading."""
        if not isinstance(shards, list):
            return shards
        return [
            {k: v for k, v in s.items() if k not in PLAN_KEYS} if isinstance(s, dict) else s for s in shards
        ]

    @property
    def complete(self) -> bool:
        return self.state == "complete"

    def ranges(self) -> list[RangeRef]:
        """A range plan's ranges, in file order."""
        return sorted((s for s in self.shards if isinstance(s, RangeRef)), key=lambda s: s.start)

    def files(self) -> list[ShardRef]:
        """The shards that are files of their own (all of them, but in a range plan's)."""
        return [s for s in self.shards if isinstance(s, ShardRef)]


def read_manifest(directory: JsonlDir) -> OutputManifest | None:
    """``directory``'s manifest, or ``None`` when it has none. Unreadable ones (and unknown versions
    or fields) are errors."""
    loc = directory.loc.child(MANIFEST_NAME)
    data = read_json(loc, schema_version=OUTPUT_MANIFEST_VERSION, what="manifest", remedy=_REMEDY)
    if data is None:
        return None
    data.pop("schema_version", None)
    try:
        return OutputManifest.model_validate(data)
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors()[:3])
        raise StorageError(
            f"{loc.uri}: not a manifest this version of airflow-batchinfer reads ({why}); {_REMEDY}"
        ) from exc


def write_manifest(directory: JsonlDir, manifest: OutputManifest) -> None:
    data = manifest.model_dump(mode="json", exclude_none=True)
    write_json(directory.loc.child(MANIFEST_NAME), data, schema_version=OUTPUT_MANIFEST_VERSION)


def claim_output(
    directory: JsonlDir,
    *,
    kind: OutputKind,
    fingerprint: dict[str, Any],
    overwrite: bool,
    reuse: bool = True,
) -> OutputManifest | None:
    """Prepare ``directory`` for a run of ``kind`` over ``fingerprint``.

    Returns the complete manifest of an identical earlier run (to reuse it, unless ``reuse=False``;
    ``overwrite`` does not prevent that: identical inputs make identical outputs), or ``None`` after
    clearing what an interrupted run, or (with ``overwrite``) anything else, left behind. Shards of
    any other writer are refused with :class:`OutputExistsError`.
    """
    manifest = read_manifest(directory)
    same = manifest is not None and manifest.kind == kind and manifest.fingerprint == fingerprint
    if same and reuse and manifest is not None and manifest.complete:
        return manifest
    existing = directory.shards()
    if existing and not same and not overwrite:
        if manifest is not None:
            source = (manifest.fingerprint or {}).get("source")
            owner = f"a {manifest.kind} run over {source} with other inputs or settings"
        else:
            owner = "an unknown writer"
        raise OutputExistsError(
            f"{directory.uri} already holds {len(existing)} shards written by {owner}. Choose an empty "
            "destination, or pass overwrite=True (CLI: --overwrite) to replace them."
        )
    directory.delete_shards()
    write_manifest(directory, OutputManifest(kind=kind, state="in_progress", fingerprint=fingerprint))
    return None
