"""Round 0 over byte-range shards, at the round's close: each range's real records and ids (as its
job read them, or read here when no job read it to its end), and the run's ``rejects/`` and
``input/_manifest.json`` from every range's line counts (:func:`close_input_ranges`)."""

from __future__ import annotations

import dataclasses
import itertools
import logging

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.run.accepted import Settled
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Digest, UnreadablePart, write_failed
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.storage.digest import IdDigest, record_ids
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.manifest import read_manifest, write_manifest
from airflow_batchinfer.storage.ranges import read_range
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef

log = logging.getLogger("airflow_batchinfer.run")

UNNUMBERED = "unnumbered"  # in a range's read counts: it holds bytes it could not read (line count unknown)


def settle_range(cfg: RunConfig, layout: RunLayout, r: int, x: Settled, so: StorageOptions | None) -> Settled:
    """A round-0 range shard's real records and ids: ``ids["input"]`` and the ``read`` counts of
    the job that read the range, or (no job read it to the end: the shard is quarantined) from
    reading the range here, its bad lines to the same ``input-rejects`` file a job writes. A
    quarantined range with pieces that cannot be read (a corrupt row group, a part changed or gone:
    what failed its job) accounts for the ids it can read, its ``failed/`` record naming those pieces
    (``unreadable``): the close completes, only that shard fails."""
    shard = x.shard.range_ref
    if shard is None:
        return x
    sid = shard.shard_id
    skipped: list[UnreadablePart] = []  # the pieces a quarantined range's read could not read
    reader = next((d for d in x.jobs if d.counts.read is not None), None)
    ids = reader.digest("input") if reader is not None else None
    if reader is not None and reader.counts.read is not None and ids is not None:
        stats = reader.counts.read.model_dump()
    else:
        ids = IdDigest()
        with JsonlFile(layout.range_rejects(r, sid), storage_options=so).writer_sync() as rejects:
            rng = read_range(
                shard,
                id_field=cfg.data.id_field,
                assign_ids=cfg.data.assign_ids,
                rejects=rejects,
                storage_options=so,
            )
            # one pass: each iter() of a reader reads the range again
            records = rng.until_unreadable() if x.failed is not None else iter(rng)
            for block in iter(lambda: list(itertools.islice(records, 4096)), []):
                ids.add_many(record_ids(block, rng.check.id_field or cfg.data.id_field or "id"))
        stats = rng.stats.as_dict()
        x.opened = True
        for lost in rng.unreadable:
            log.error("round %d: shard %s: %s cannot be read: %s", r, sid, lost.describe(), lost.error)
            skipped.append(UnreadablePart.model_validate(dataclasses.asdict(lost)))
            if lost.records is None:  # a byte range's: the lines after this range cannot be numbered
                stats[UNNUMBERED] = 1
    x.read = stats
    x.shard = x.shard.with_ref(shard.model_copy(update={"records": ids.count, "ids": ids}))
    if x.failed is not None:  # its quarantine record accounts for the ids as read
        update = {"records": ids.count, "ids": Digest.of(ids), "unreadable": skipped or None}
        x.failed = x.failed.model_copy(update=update)
        write_failed(layout, x.failed, so)
    return x


def close_input_ranges(layout: RunLayout, settled: list[Settled], so: StorageOptions | None) -> None:
    """Round 0 over range shards: the run's ``rejects/`` rows get absolute line numbers (each range's
    first line is the sum of the line counts of every range before it), one file per shard with
    bad lines, rewritten whole (a re-run close writes the same); ``input/_manifest.json`` gets the
    input's counts and each shard's records, ids and line counts (``read``) as read. A re-run
    close plans only shards with records, so the line counts of the others come from there."""
    fresh: dict[str, ShardRef | RangeRef] = {
        x.shard.shard_id: x.shard.range_ref.model_copy(update={"read": x.read})
        for x in settled
        if x.read is not None and x.shard.range_ref is not None
    }
    if not fresh:
        return
    input_dir = JsonlDir(layout.input, storage_options=so)
    manifest = read_manifest(input_dir)
    if manifest is None:
        raise StorageError(f"{input_dir.uri} has no manifest: round 0's shards are planned there")
    shards = [fresh.get(s.shard_id, s) for s in manifest.shards]
    totals = dict.fromkeys(("lines", "records", "blank", "skipped", "quarantined"), 0)
    first_line, last = 0, False
    for shard in sorted((s for s in shards if isinstance(s, RangeRef)), key=lambda s: s.start):
        sid, read = shard.shard_id, shard.read
        if read is None:  # never read to its end: the lines after it cannot be numbered
            log.error("round 0: range shard %s was never read: rejects after it keep line_in_range only", sid)
            break
        if read.get(UNNUMBERED):  # bytes it could not read: how many lines they hold is unknown
            log.error(
                "round 0: range shard %s has unreadable bytes: rejects after it keep line_in_range", sid
            )
            last = True
        if sid in fresh and read.get("quarantined"):
            rows = JsonlFile(layout.range_rejects(0, sid), storage_options=so).iter_records()
            with JsonlFile(join(layout.rejects, f"{sid}.jsonl.zst"), storage_options=so).writer_sync() as out:
                for row in rows:
                    out.write({**row, "line_no": first_line + int(row["line_in_range"]), "shard_id": sid})
        first_line += read.get("lines", 0)
        for k in totals:
            totals[k] += read.get(k, 0)
        if last:
            break
    write_manifest(input_dir, manifest.model_copy(update={"shards": shards, "counts": totals}))
