"""Round 0 over byte-range shards: ids repeated across ranges (each range's job finds repeats only
within its range). The first occurrence stays; the later ones are left out of what close accepts
and rejected into ``rejects/`` (with a fan-out, each of a repeated line's rows: :func:`fanned`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from airflow_batchinfer.engines.adapters import counted
from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.judges.reasons import OTHER, reason_group, row_reason
from airflow_batchinfer.judges.spot_check import is_spot_check
from airflow_batchinfer.run.accepted import Settled
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import AcceptedJob, Digest, RepeatedIds, RepeatsLeftOut, write_failed
from airflow_batchinfer.state.layout import FENCED_OUTPUTS, SHARD_SUFFIX, RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.state.tally import Generated, Tally
from airflow_batchinfer.storage import JsonlDir, JsonlFile, files
from airflow_batchinfer.storage.digest import IdDigest, id_bytes
from airflow_batchinfer.storage.fan_out import ADAPTER_FIELD
from airflow_batchinfer.storage.id_hash_files import hashes_beside
from airflow_batchinfer.storage.id_hashes import Repeat, Repeats, find_repeats, rejects_uri
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.manifest import read_manifest

log = logging.getLogger("airflow_batchinfer.run")


REPEATED = "repeated"  # ids digest of the repeats a shard's accepted doc left out (rejects/)


def range_repeats(cfg: RunConfig, layout: RunLayout, so: StorageOptions | None) -> Repeats:
    """Round 0 over range shards: the later occurrences of ids that an earlier range holds (each
    range's job finds repeats only within its range), from the ranges' id hash files its jobs wrote
    (:mod:`~airflow_batchinfer.storage.id_hashes`); the first occurrence stays, the others are
    rejected (:func:`drop_repeats`, :func:`settle_repeats`). What grows with the repeats spills under
    the run root (``layout.spill(0)``), never onto the Airflow worker's temp disk."""
    manifest = read_manifest(JsonlDir(layout.input, storage_options=so))
    ranges = [] if manifest is None else manifest.ranges()
    if manifest is None or len(ranges) < 2:
        return Repeats()
    # where every range's job writes it (infer, or infer_judge: the one reading the range)
    repeats = find_repeats(
        ranges,
        lambda sid: hashes_beside(layout.job_manifest(0, sid, "infer"), sid),
        id_field=manifest.id_field or cfg.data.id_field,
        assign_ids=cfg.data.assign_ids,
        so=so,
        spill=layout.spill(0),
    )
    if repeats.count:
        log.warning(
            "round 0: %s holds %d later occurrences of ids an earlier line holds (in other byte "
            "ranges): each is rejected into %s, the first stays",
            cfg.data.input,
            repeats.count,
            layout.rejects,
        )
    return repeats


def fanned(shard: PlannedShard, repeats: list[Repeat]) -> list[Repeat]:
    """The repeats of a range shard as its rows: with a fan-out, each repeated line once per arm, by
    its row's id (what its job wrote, and what its rejects rows carry); else ``repeats``."""
    fan_out = shard.range_ref.fanned if shard.range_ref is not None else None
    if fan_out is None:
        return repeats
    return [dataclasses.replace(x, id=fan_out.row_id(x.id, arm)) for x in repeats for arm in fan_out.arms]


def drop_repeats(
    doc: AcceptedJob, repeats: list[Repeat], id_field: str, rejects: str, so: StorageOptions | None
) -> AcceptedJob:
    """The accepted doc of a shard holding ``repeats``: its staged approved and rejected files
    rewritten without those rows (beside the originals, atomically: a re-run close rewrites the
    same), its counts, reason groups and id digests less theirs (``ids.repeated``: what was left
    out, ``repeats``: how many and their ``rejects/`` file). An inferred file keeps them: it is what
    the accepted judge read (rewriting it would make that judge stale), and nothing counts it."""
    if not repeats:
        return doc
    drop = {id_bytes(x.id) for x in repeats}
    doc = doc.model_copy(deep=True)
    doc.ids, doc.reason_groups = doc.ids or {}, doc.reason_groups or {}
    left_out = IdDigest()
    for name in FENCED_OUTPUTS:
        src = doc.committed.get(name)
        if src is None:  # written in place (no staging): nothing to rewrite before promotion
            raise StorageError(
                f"shard {doc.shard_id}: {len(repeats)} ids repeated from earlier ranges (first: "
                f"{repeats[0].id!r} at line {repeats[0].line}) but its {name} output was not staged: "
                "delete its job manifest and re-run the DAG run to recompute it"
            )
        dst = src[: -len(SHARD_SUFFIX)] + ".unrepeated" + SHARD_SUFFIX
        gone = _rewrite_without(src, dst, drop, id_field, so)
        for row in gone:
            _uncount(doc, row, name)
        removed = IdDigest.of(row.get(id_field) for row in gone)
        before = doc.digest(name)
        if before is not None:
            doc.ids[name] = Digest.of(before - removed)
        doc.committed[name] = dst
        left_out += removed
    doc.ids[REPEATED] = Digest.of(left_out)
    doc.counts.repeated_ids = left_out.count
    doc.repeats = RepeatsLeftOut(count=left_out.count, rejects=rejects)
    return doc


def _rewrite_without(
    src: str, dst: str, drop: set[bytes], id_field: str, so: StorageOptions | None
) -> list[dict[str, Any]]:
    """Copy ``src`` to ``dst`` (atomically) without the rows whose id is in ``drop``; returns those."""
    gone: list[dict[str, Any]] = []
    with JsonlFile(dst, storage_options=so).writer_sync() as out:
        for row in JsonlFile(src, storage_options=so).iter_records():
            if id_bytes(row.get(id_field)) in drop:
                gone.append(row)
            else:
                out.write(row)
    return gone


def _uncount(doc: AcceptedJob, row: dict[str, Any], output: str) -> None:
    """Take one left-out row out of the doc's counts (as its job counted it) and reason groups."""
    doc.counts -= _row_tally(doc.kind, row)
    groups = doc.reason_groups
    if output == "rejected" and groups:
        group = reason_group(row_reason(row))
        key = group if groups.get(group) else OTHER
        if groups.get(key):
            groups[key] = int(groups[key]) - 1
            if not groups[key]:
                del groups[key]


def _row_tally(kind: str, row: dict[str, Any]) -> Tally:
    """What a job of ``kind`` counted of ``row`` by outcome and adapter (:mod:`~airflow_batchinfer.
    worker.jobs.judge`, :mod:`~airflow_batchinfer.worker.jobs.in_place`)."""
    tally = Tally()
    judgment = row.get("judgment")
    judgment = judgment if isinstance(judgment, dict) else {}
    status, held, errored = str(row.get("status")), is_spot_check(judgment), row.get("error") is not None
    outcomes = tally.outcomes
    if status in ("approved", "rejected", "max_attempts", "error"):  # (in place: the last two)
        setattr(outcomes, status, 1)
    outcomes.for_review = int(bool(judgment.get("for_review")))
    outcomes.spot_checks = int(held)
    if kind in ("judge", "infer_judge"):
        outcomes.inference_errors = int(errored)
    if kind == "infer_judge":  # its inference counts each row: ok or error
        tally.generated = Generated(ok=int(not errored), error=int(errored))
    # its adapter's count: a judged row without an inference error (in place: not errored)
    answered = status != "error" if kind == "in_place" else not errored
    if answered and (name := counted(row.get(ADAPTER_FIELD))) is not None:
        tally.count_adapter(name, status, held)
    return tally


def settle_repeats(
    layout: RunLayout, r: int, x: Settled, repeats: list[Repeat], id_field: str, so: StorageOptions | None
) -> None:
    """The rejects of a shard's repeats: ``rejects/<shard>.repeated-ids.jsonl.zst`` (rewritten whole,
    the same each close) once the shard is accepted without them. A quarantined shard holds them in
    its ``failed/`` record (its whole range is retried; they are rejected when it is accepted)."""
    if r != 0 or x.shard.range_ref is None:
        return
    sid = x.shard.shard_id
    uri = rejects_uri(layout.rejects, sid)
    left_out = x.accepted.repeats if x.accepted is not None else None
    if left_out is not None and left_out.count:
        with JsonlFile(uri, storage_options=so).writer_sync() as out:
            for rep in repeats:
                out.write(rep.reject_row(x.shard.uri, id_field))
        return
    files.remove(uri, so)  # no accepted doc leaves them out (now): none are rejected
    if not repeats:
        return
    first = f"id {repeats[0].id!r} at line {repeats[0].line} (first at line {repeats[0].first_line})"
    if x.failed is not None:
        note = "rejected into rejects/ once the shard is accepted: the first occurrence stays"
        repeated = RepeatedIds(count=len(repeats), first=first, note=note)
        x.failed = x.failed.model_copy(update={"repeated_ids": repeated})
        write_failed(layout, x.failed, so)
    elif x.accepted is not None:
        log.error(
            "round 0: shard %s was accepted before repeats were rejected: its %d repeated ids (%s) "
            "stay in its outputs",
            sid,
            len(repeats),
            first,
        )
