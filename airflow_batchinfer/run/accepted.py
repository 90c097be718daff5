"""A shard's accepted doc (``jobs/<shard>.<kind>.accepted.json``): what close accepts of a job, and
the compare-and-swap every decision on it is (:func:`claim`), so of two closes of a round at once
one decides and the other adopts that decision. Also what settling a shard finds and decides
(:class:`Checked`, :class:`Settled`), shared by the settle, quarantine, repeats and close modules."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.state.docs import (
    AcceptedJob,
    FailedShard,
    JobFigures,
    JobManifest,
    QuarantinedJob,
    parse_accepted,
)
from airflow_batchinfer.state.layout import fenced_outputs
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage import JsonlFile, swap
from airflow_batchinfer.storage.digest import IdDiff, IdDigest
from airflow_batchinfer.storage.location import StorageOptions, resolve

log = logging.getLogger("airflow_batchinfer.run")


Doc = AcceptedJob | QuarantinedJob  # a shard's accepted doc, either way close decided
Figures = JobManifest | AcceptedJob  # a job that counts: its valid manifest, or what close accepted of it


@dataclass
class Settled:
    """What close decided for one shard."""

    shard: PlannedShard
    jobs: list[Figures]  # valid manifests / the accepted doc: tokens, timings, workers
    counts: Tally | None  # the accepted attempt's counts; None when quarantined
    failed: FailedShard | None = None  # its quarantine record, as written to failed/
    orphans: list[str] = field(default_factory=list)
    accepted: AcceptedJob | None = None  # the accepted doc (its ``ids``, final ``outputs``)
    # The id accounting (see _account): the shard's digest, its outputs' digests (None when
    # quarantined), whether its files were read, and what reading them found.
    planned: IdDigest = field(default_factory=IdDigest)
    # A round-0 range shard's line counts as read (lines, records, blank, skipped, quarantined).
    read: dict[str, int] | None = None
    outputs: dict[str, IdDigest] | None = None
    opened: bool = False
    diff: IdDiff | None = None


@dataclass(frozen=True)
class Sweeping:
    """Another close's quarantine of the shard, still sweeping: wait for it, then settle again."""

    doc: QuarantinedJob


def is_sweeping(doc: Doc | None) -> bool:
    return isinstance(doc, QuarantinedJob) and doc.sweeping


@dataclass
class Checked:
    """One job of a shard as close finds it."""

    kind: str
    manifest: JobManifest | None
    seen: Doc | None  # its accepted doc as read (quarantined or stale too): claims swap from it
    manifest_current: bool = False
    doc: Figures | None = None  # what counts: ``seen`` (accepted earlier) or ``manifest``
    problem: str | None = None  # why neither is current

    @property
    def kept(self) -> bool:
        return self.doc is not None and self.doc is self.seen


def claim(uri: str, seen: Doc | None, doc: Doc, so: StorageOptions | None) -> tuple[Doc, bool]:
    """Write the decision ``doc`` at ``uri`` unless another close changed it since this one read
    ``seen`` (one compare-and-swap, :func:`airflow_batchinfer.storage.swap.update`: a lock on a local
    disk, ``If-None-Match``/``If-Match`` on S3). Returns the decision that stands (with its
    ``schema_version``) and whether it is ``doc``."""
    loc = resolve(uri, so)
    mine = doc.encode()

    def change(current: bytes | None) -> bytes:
        if current is not None and parse_accepted(loc, current) != seen:
            return current  # decided by another close after this one read it: that stands
        return mine

    data = swap.update(loc, change)
    return parse_accepted(loc, data), data == mine


def log_claim(r: int, sid: str, stood: Doc, won: bool, mine: AcceptedJob) -> None:
    if isinstance(stood, AcceptedJob):
        what = f"attempt {stood.attempt} of {stood.job_id} ({stood.kind})"
    else:
        what = f"quarantine ({stood.kind})"
    if won:
        log.info("round %d: shard %s: accepted %s", r, sid, what)
    else:
        log.warning(
            "round %d: shard %s: another close of the round decided first; accepting its %s, not attempt %s",
            r,
            sid,
            what,
            mine.attempt,
        )


def accepted_doc(
    m: JobManifest,
    sid: str,
    kind: str,
    final: dict[str, str],
    manifest_uri: str,
    so: StorageOptions | None,
) -> AcceptedJob:
    """What close accepts of a job: its attempt, the staged files to move, the counts to use and the
    version of the input it read (a judge's, an infer attempt, is moved to inferred/ after)."""
    info = input_info(m.input, so) if m.input else None
    # as a JSON doc stored it before (what close compares a later read with)
    version = {k: _plain(info[k]) for k in ("size", "ETag", "mtime") if k in info} if info else None
    return AcceptedJob.model_validate(
        {
            "shard_id": sid,
            "kind": kind,
            "job_id": m.job_id,
            "fingerprint": m.fingerprint,
            "attempt": m.attempt,
            "committed": dict(m.committed or {}),  # name -> staged URI (none: written in place)
            "outputs": {name: final[name] for name in fenced_outputs(kind)},
            "manifest": manifest_uri,
            "input": m.input,
            "input_info": version,
            **m.model_dump(include=set(JobFigures.model_fields)),
            "accepted_at": time.time(),
        }
    )


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, int | float | str) else str(value)


def input_info(uri: str, so: StorageOptions | None) -> dict[str, Any] | None:
    try:
        return JsonlFile(uri, storage_options=so).info()
    except FileNotFoundError:
        return None
