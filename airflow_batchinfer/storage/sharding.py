"""Shard one JSONL(.zst) dataset into a directory of full shards, once, streaming.

Lines pass through byte for byte (no re-serialization) unless an id is assigned, which is what
keeps sharding near the speed of ``split``. Every line ends up counted as a record, a blank, a
skipped line or a quarantined reject.

Each shard's reference (:class:`~airflow_batchinfer.storage.shard_ref.ShardRef`) carries ``ids``:
the count and order-independent digest of its records' ids
(:class:`~airflow_batchinfer.storage.digest.IdDigest`), the start of the run's id accounting. A
rejected line has no usable id (that is why it is rejected: invalid JSON, no id, a repeated id), so
rejects are accounted for by line (``counts["quarantined"]``), never by id.

With a fan-out (:mod:`~airflow_batchinfer.storage.fan_out`) each kept record is written once per
arm: the shards hold (and their ``records`` and ``ids`` count) rows, ``counts`` the input's lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.file_version import keep_recorded, version_tag
from airflow_batchinfer.storage.jsonl_dir import (
    DEFAULT_BYTES_PER_SHARD,
    DEFAULT_RECORDS_PER_SHARD,
    Compression,
    JsonlDir,
    ShardWriter,
)
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.lines import MAX_LINE_BYTES
from airflow_batchinfer.storage.location import StorageOptions, join, parent
from airflow_batchinfer.storage.manifest import OutputManifest, claim_output, read_manifest, write_manifest
from airflow_batchinfer.storage.reader import ErrorPolicy
from airflow_batchinfer.storage.records import MAX_ID_BYTES, OnError, dumps
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef
from airflow_batchinfer.storage.validate import LineValidator, detect_id_field
from airflow_batchinfer.storage.writer import DEFAULT_ZSTD_LEVEL

Progress = Callable[[int, int], None]
"""``progress(records, nbytes)``: called with increments as input is consumed."""

REJECTS_PER_SHARD = 100_000
__all__ = ["ShardingResult", "detect_id_field", "shard_dataset"]


@dataclass(frozen=True)
class ShardingResult:
    """Shard references plus the counts that account for every input line.

    ``counts`` holds ``lines``, ``records``, ``blank``, ``skipped`` and ``quarantined``, with
    ``lines == records + blank + skipped + quarantined``. Each shard's ``ids`` is the digest of its
    ids.
    """

    shards: list[ShardRef | RangeRef]
    counts: dict[str, int]
    id_field: str
    rejects_uri: str
    reused: bool = False
    seconds: float = field(default=0.0, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shards": [s.to_json() for s in self.shards],
            "counts": self.counts,
            "id_field": self.id_field,
            "rejects_uri": self.rejects_uri,
            "reused": self.reused,
        }


def shard_dataset(
    src: str,
    dst: str,
    *,
    records_per_shard: int = DEFAULT_RECORDS_PER_SHARD,
    max_bytes_per_shard: int = DEFAULT_BYTES_PER_SHARD,
    id_field: str | None = None,
    assign_ids: bool = False,
    on_error: OnError | str = "quarantine",
    rejects: str | None = None,
    compression: Compression = "zstd",
    compression_level: int = DEFAULT_ZSTD_LEVEL,
    storage_options: StorageOptions | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_id_bytes: int = MAX_ID_BYTES,
    fan_out: FanOut | None = None,
) -> ShardingResult:
    """Stream ``src`` (one ``.jsonl`` / ``.jsonl.zst`` file) into shards under ``dst``.

    :param records_per_shard: records per shard (the last shard may hold fewer).
    :param max_bytes_per_shard: uncompressed bytes per shard; a bigger record gets its own shard.
    :param id_field: the unique-id field. ``None`` detects it from the first record: ``custom_id`` for
        an OpenAI batch input file, else ``id``.
    :param assign_ids: give records without an id the id ``"<source name>:<line_no>"``.
    :param on_error: ``quarantine`` (default: bad lines go to ``rejects`` as
        ``{source, line_no, error, raw}``), ``raise`` (stop, naming file and line) or ``skip`` (count).
        Bad lines are invalid JSON, non-UTF-8 bytes, non-object values, missing/invalid ids and ids
        repeated within a shard.
    :param rejects: where quarantined lines go; default ``rejects/`` beside ``dst``. Like ``dst``, it
        belongs to this run: shards another run left there are refused unless ``overwrite``.
    :param overwrite: replace shards in ``dst`` that another run wrote. Without it, an identical
        earlier run is reused, an interrupted identical run is redone, and anything else is refused.
    :param progress: ``progress(records, nbytes)`` callback for progress bars.
    :param max_line_bytes: a longer line is bad (its reject row keeps its first KiB and
        ``raw_bytes``), and is never held whole while it is read.
    :param max_id_bytes: a longer id (UTF-8 bytes of it as text) makes its line bad.
    :param fan_out: write each record once per arm (``records_per_shard`` counts those rows); a
        record it cannot fan out is a bad line.
    :returns: a :class:`ShardingResult`; its refs reference shards, never carry records. Each
        carries ``ids``, the count and digest of its ids (rejects are counted by line, not by id).
    """
    started = time.monotonic()
    source = JsonlFile(src, storage_options=storage_options, max_line_bytes=max_line_bytes)
    out = JsonlDir(dst, storage_options=storage_options)
    rejects_dir = JsonlDir(rejects or join(parent(out.uri), "rejects"), storage_options=storage_options)
    settings = {"records_per_shard": records_per_shard, "max_bytes_per_shard": max_bytes_per_shard,
                "id_field": id_field, "assign_ids": assign_ids, "on_error": on_error,
                "compression": compression, "rejects": rejects_dir.uri}  # fmt: skip
    fingerprint = _fingerprint(source, settings, max_line_bytes, max_id_bytes, fan_out)
    if (earlier := read_manifest(out)) is not None:  # from before local versions carried inode and ctime
        fingerprint = keep_recorded(fingerprint, earlier.fingerprint)
    done = claim_output(out, kind="shard", fingerprint=fingerprint, overwrite=overwrite)
    if done is not None:
        return _reused(done)
    # The rejects directory is claimed too: an interrupted run's rejects are redone, never doubled,
    # and another run's rejects are never deleted.
    claim_output(rejects_dir, kind="shard-rejects", fingerprint=fingerprint, overwrite=overwrite, reuse=False)
    writer = out.writer_sync(
        max_records_per_shard=records_per_shard,
        max_bytes_per_shard=max_bytes_per_shard,
        compression=compression,
        compression_level=compression_level,
    )
    reject_writer = rejects_dir.writer_sync(max_records_per_shard=REJECTS_PER_SHARD)
    policy = ErrorPolicy(source.uri, on_error, reject_writer)
    check = _validator(policy, source, id_field, assign_ids, records_per_shard, max_id_bytes, fan_out)
    _write_shards(source, check, writer, reject_writer, fan_out, progress)
    result = ShardingResult(
        shards=[*writer.shards_written],
        counts=policy.stats.as_dict(),
        id_field=check.id_field or "id",
        rejects_uri=rejects_dir.uri,
        seconds=time.monotonic() - started,
    )
    write_manifest(
        out, OutputManifest(kind="shard", state="complete", fingerprint=fingerprint, **result.as_dict())
    )
    return result


def _reused(done: OutputManifest) -> ShardingResult:
    """The result an identical earlier sharding recorded in its manifest."""
    return ShardingResult(
        shards=done.shards,
        counts=done.counts or {},
        id_field=done.id_field or "id",
        rejects_uri=done.rejects_uri or "",
        reused=True,
    )


def _fingerprint(
    source: JsonlFile,
    settings: dict[str, Any],
    max_line_bytes: int,
    max_id_bytes: int,
    fan_out: FanOut | None,
) -> dict[str, Any]:
    """What makes two shardings the same: the input (its URI, size and version: ETag, else mtime
    with a local file's inode and ctime, :func:`~airflow_batchinfer.storage.file_version.version_tag`)
    and the ``settings`` that shape the output, in that order."""
    info = source.info()
    return {
        "source": source.uri,
        "size": info.get("size"),
        "version": version_tag(info),
        **settings,
        **bounds_fingerprint(max_line_bytes, max_id_bytes),
        **({"fan_out": fan_out.as_json()} if fan_out is not None else {}),  # none: as before fan-outs
    }


def _validator(
    policy: ErrorPolicy,
    source: JsonlFile,
    id_field: str | None,
    assign_ids: bool,
    records_per_shard: int,
    max_id_bytes: int,
    fan_out: FanOut | None,
) -> LineValidator:
    """The lines' validator; ``assign_ids``: a record without an id gets ``<source name>:<line_no>``."""
    source_name = source.loc.name
    # Repeated ids: every shard holds at most records_per_shard consecutive kept records, so a window
    # of that many (two generations) makes any two records of one shard meet.
    return LineValidator(
        policy,
        id_field=id_field,
        assign=(lambda line_no, _offset: f"{source_name}:{line_no}") if assign_ids else None,
        window=records_per_shard,
        max_id_bytes=max_id_bytes,
        fan_out=fan_out,
    )


def _write_shards(
    source: JsonlFile,
    check: LineValidator,
    writer: ShardWriter,
    reject_writer: ShardWriter,
    fan_out: FanOut | None,
    progress: Progress | None,
) -> None:
    """Stream ``source``'s good lines (each record's arms with ``fan_out``) into ``writer``'s shards
    and its bad ones into ``reject_writer``'s; closes both. Each shard gets the digest of its ids."""
    # Ids written but not yet in a committed shard's digest, in order: each shard the writer commits
    # takes the first ``records`` of them (the writer rotates by records and bytes, in order).
    unsealed: list[Any] = []
    sealed = 0
    with reject_writer, writer:
        for block in source.iter_line_blocks():
            good, ids, records = check.check_block(block)
            if fan_out is not None and good:
                rows = fan_out.expand(records, check.id_field or "id")
                good, ids = [dumps(r) for r in rows], fan_out.ids(ids)
            if good:
                writer.write_lines(good)
                unsealed.extend(ids)
                sealed = _seal(writer.shards_written, sealed, unsealed)
            if progress is not None:
                progress(len(good), sum(map(len, block)) + len(block))
    _seal(writer.shards_written, sealed, unsealed)  # the last shard, committed as the writer closed


def bounds_fingerprint(max_line_bytes: int | None, max_id_bytes: int | None) -> dict[str, int | None]:
    """The line and id bounds as fingerprint keys, only where they differ from the defaults (as job
    params leave defaults out: a run at the defaults keeps the fingerprint it has)."""
    return {
        k: v
        for k, v, default in (
            ("max_line_bytes", max_line_bytes, MAX_LINE_BYTES),
            ("max_id_bytes", max_id_bytes, MAX_ID_BYTES),
        )
        if v != default
    }


def _seal(written: list[ShardRef], sealed: int, unsealed: list[Any]) -> int:
    """Give each shard committed since the ``sealed`` first the digest of its ids, the first
    ``records`` of ``unsealed`` (removed from it). Returns how many shards have their digest."""
    for i in range(sealed, len(written)):
        n = written[i].records
        written[i] = written[i].model_copy(update={"ids": IdDigest.of(unsealed[:n])})
        del unsealed[:n]
    return len(written)
