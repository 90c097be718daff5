"""The whole-run id check of the run report: every input id accounted for exactly once, from the
rounds' digests or, failing them, by reading the ids."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from airflow_batchinfer.run.close import MAX_NAMED
from airflow_batchinfer.run.plan import (
    ACCEPTED_BY_REVIEW,
)
from airflow_batchinfer.state.docs import (
    FailedShard,
    Plan,
    Summary,
    review_applied,
)
from airflow_batchinfer.state.docs.reviewed import ReviewApplied
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, files
from airflow_batchinfer.storage.digest import IdDigest, diff_ids, file_ids, record_ids, total
from airflow_batchinfer.storage.id_hashes import REJECTS_SUFFIX
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.manifest import OutputManifest, read_manifest
from airflow_batchinfer.storage.ranges import DiscardRejects, read_range
from airflow_batchinfer.storage.record_file import RecordFile
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef


def check_invariant(
    layout: RunLayout,
    id_field: str,
    pending: list[ShardRef | RangeRef],
    rounds: list[Summary],
    failed: list[FailedShard],
    so: StorageOptions | None = None,
    *,
    plans: list[Plan] | None = None,
) -> dict[str, Any]:
    """Every input id is in exactly one of: results (approved or accepted), the final pending set,
    an in-place round's exhausted rows, or (by shard) a quarantined job; a later occurrence of an id
    in another of round 0's byte ranges is in ``rejects/`` instead (the input's digests count lines:
    such an id twice, in results or pending once and in rejects once).

    Checked from digests, in O(shards) and holding no id in memory: the input's shard digests
    (``input/_manifest.json``) must equal the sum of every round's approved, exhausted and
    quarantined digests (``summary.json``), the final pending set's shard digests and what a review
    accepted (its plan). Each round's close checked its own shards and named the ids it found lost or
    doubled; the report repeats them. Only a run whose digests disagree with no round naming why (or
    that lacks some: an incomplete run, rows a review accepted by hand) is checked by reading its ids, in
    bounded memory (:func:`~airflow_batchinfer.storage.digest.diff_ids`); round 0's range shards
    (:mod:`~airflow_batchinfer.storage.ranges`), a quarantined one's included, are then read by
    their ranges, never the whole source. ``lost``, ``doubled`` and ``unexpected`` name at most 20
    ids each; ``checked`` says how (``digests`` or ``ids``). A quarantined range with pieces that could not
    be read accounts for the ids read (its ``failed/`` record's, and those read here): the rest have
    no ids to account for, and ``unreadable`` names them by shard, part and row groups or bytes."""
    unreadable = {"unreadable": found} if (found := _unreadable(failed)) else {}
    manifest = read_manifest(JsonlDir(layout.input, storage_options=so))
    planned = [] if manifest is None else manifest.shards
    expected = total(s.ids for s in planned)
    parts: list[IdDigest | None] = [s.ids for s in pending]
    for x in rounds:
        names = ("approved", "failed") + (("exhausted",) if x.mode == "in_place" else ())
        # round 0's repeats, rejected: lines read
        names += ("repeated",) if "repeated" in (x.ids or {}) else ()
        parts += [x.digest(name) for name in names]
    parts += _accepted_ids(layout, plans, so)
    accounted = total(parts)
    named = {k: _named(getattr(x.invariant, k) for x in rounds) for k in ("lost", "doubled", "unexpected")}
    if expected is not None and accounted is not None and (expected == accounted or any(named.values())):
        return {
            "input": expected.count,
            "accounted": accounted.count,
            **named,
            "ok": expected == accounted and not any(named.values()),
            "checked": "digests",
            **unreadable,
        }
    # No digests to go by, or digests that disagree with no round naming why: read the ids.
    input_dir = JsonlDir(layout.input, storage_options=so)
    ranges = {s.shard_id: s for s in planned if isinstance(s, RangeRef)}
    reads = _RangeIds(manifest, id_field, so)
    seen: list[RecordFile | RangeRef] = list(JsonlDir(layout.results, storage_options=so).jsonl_files())
    seen += [s if isinstance(s, RangeRef) else JsonlFile(s.uri, storage_options=so) for s in pending]
    seen += JsonlDir(layout.dropped, storage_options=so).jsonl_files()  # what reviewers dropped
    # round 0's repeats rejected into rejects/ (each row has its id)
    rejects = JsonlDir(layout.rejects, storage_options=so).jsonl_files()
    seen += [f for f in rejects if f.uri.endswith(REJECTS_SUFFIX)]
    for x in rounds:
        if x.mode == "in_place":
            seen += JsonlDir(layout.rejected_dir(x.round), storage_options=so).jsonl_files()
    for f in failed:  # a failed job: its whole input shard (round 0's: the range it was to read)
        shard = ranges.get(f.shard_id) if f.round == 0 else None
        seen.append(shard or JsonlFile(f.uri, storage_options=so))
    # Range shards of the source leave nothing under input/ but the manifest.
    inputs: list[RecordFile | RangeRef] = (
        list(ranges.values()) if ranges else [input_dir.file(s.name) for s in input_dir.shards()]
    )
    diff = diff_ids(lambda: reads.ids(inputs), lambda: reads.ids(seen), limit=MAX_NAMED)
    return {
        "input": diff.expected.count,
        "accounted": diff.actual.count,
        "lost": diff.lost,
        "doubled": diff.doubled,
        "unexpected": diff.unexpected,
        "ok": diff.ok,
        "checked": "ids",
        **unreadable,
    }


def _unreadable(failed: list[FailedShard]) -> list[dict[str, Any]]:
    """The records of quarantined range shards that could not be read, each with its shard."""
    return [{"shard_id": f.shard_id, **u.model_dump()} for f in failed for u in f.unreadable or ()]


class _RangeIds:
    """The ids of files and of round-0 range shards, one at a time (a side of :func:`diff_ids`). A
    range is read by its range only, validated as its job read it (bad lines dropped, ids assigned
    as the run assigned them), never the whole source."""

    def __init__(self, manifest: OutputManifest | None, id_field: str, so: StorageOptions | None) -> None:
        self.id_field = id_field
        fingerprint = (manifest.fingerprint if manifest is not None else None) or {}
        self.range_id_field = (manifest.id_field if manifest is not None else None) or id_field  # round 0's
        self.assign_ids = bool(fingerprint.get("assign_ids"))
        self.so = so

    def ids(self, sources: Iterable[RecordFile | RangeRef]) -> Iterator[Any]:
        for src in sources:
            if not isinstance(src, RangeRef):
                yield from file_ids([src], self.id_field)
                continue
            reader = read_range(
                src,
                id_field=self.range_id_field,
                assign_ids=self.assign_ids,
                rejects=DiscardRejects(),
                storage_options=self.so,
            )
            # a quarantined range its job could not read to the end: the ids before that (its failed/
            # record's), on both sides of the diff
            yield from record_ids(reader.until_unreadable(), reader.check.id_field or self.range_id_field)


def _named(lists: Iterable[list[Any] | None]) -> list[Any]:
    return list(dict.fromkeys(i for ids in lists for i in ids or []))[:MAX_NAMED]


def _accepted_ids(
    layout: RunLayout, plans: list[Plan] | None, so: StorageOptions | None
) -> list[IdDigest | None]:
    """What a review took out of the pending sets, by the digests its plans recorded (``[None]`` when
    unknown): the rows accepted as they were, and those reviewers' decisions accepted or dropped."""
    if plans is None:  # the caller did not say: any accepted rows make the digests incomplete
        found = any(n.startswith("accepted-") for n in files.names(layout.results, so))
        return [None] if found else []
    accepted = [
        None if p.accepted is None else p.accepted.digest() for p in plans if p.stop == ACCEPTED_BY_REVIEW
    ]
    # what reviewers' decisions took out of a pending set: accepted into results, or dropped
    reviews = applied_reviews(layout, plans, so)
    decided: list[IdDigest | None] = [d.digest() for a in reviews for d in (a.accepted, a.dropped)]
    # the spot checks no person decided, into results as the judge said (only where there were some)
    decided += [a.approved.digest() for a in reviews if a.approved is not None]
    return accepted + decided


def applied_reviews(layout: RunLayout, plans: list[Plan], so: StorageOptions | None) -> list[ReviewApplied]:
    """What reviewers' decisions did, once per round whichever gate applied them."""
    return [a for r in sorted({p.round for p in plans}) if (a := review_applied(layout, r, so))]
