"""Quarantining a shard no valid job accounts for: its ``failed/`` record, in two steps of its
accepted doc (``sweep: sweeping``, then ``swept``) so nothing another close accepted meanwhile is
removed, and waiting for another close's sweep before deciding again."""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Iterable

from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.run.accepted import Checked, Doc, Figures, Settled, Sweeping, claim
from airflow_batchinfer.state.docs import (
    SWEEPING,
    SWEPT,
    Digest,
    FailedShard,
    QuarantinedJob,
    read_accepted,
    write_failed,
)
from airflow_batchinfer.state.layout import FENCED_OUTPUTS, RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage import files
from airflow_batchinfer.storage.location import StorageOptions, join

log = logging.getLogger("airflow_batchinfer.run")


SWEEP_WAIT_S = 60.0  # after a quarantine is decided, how long its sweep is waited for before a close
SWEEP_POLL_S = 0.2  # takes its close for gone (a sweep is a few deletes); how often it is re-read


def await_sweep(uri: str, doc: QuarantinedJob, so: StorageOptions | None) -> QuarantinedJob | None:
    """Wait until the sweeping quarantine ``doc`` at ``uri`` changes: ``None`` then (settle again from
    what stands). ``doc`` itself when it has not :data:`SWEEP_WAIT_S` after it was decided: its close
    is taken for gone (cut short) and this one may replace it; should that close still run, it stops
    at its next step, finding the doc no longer its own (:func:`_sweep_quarantined`)."""
    deadline = min(doc.quarantined_at, time.time()) + SWEEP_WAIT_S
    while time.time() < deadline:
        time.sleep(SWEEP_POLL_S)
        if read_accepted(uri, so) != doc:
            return None
    log.warning(
        "%s: the close that quarantined its shard at %s did not finish sweeping it in %.0f s: "
        "taking it for gone, this close decides again",
        uri,
        doc.quarantined_at,
        SWEEP_WAIT_S,
    )
    return doc


def quarantine_shard(
    layout: RunLayout,
    r: int,
    shard: PlannedShard,
    kinds: tuple[JobKind, ...],
    checked: list[Checked],
    problem: tuple[str, str],
    rerun: bool,
    seen: Doc | None,
    final: dict[str, str],
    so: StorageOptions | None,
) -> Settled | Sweeping | None:
    """Quarantine the shard in two steps of its accepted doc: ``sweep: sweeping`` once the decision
    stands, then delete the unusable manifest (``rerun``), sweep its staged attempts but those a
    current manifest names (a later close accepts them), remove final outputs no accepted job
    produced and write its ``failed/`` record; then ``sweep: swept``. No other close replaces a
    sweeping doc (it waits, :func:`settle_shard`), so nothing accepted meanwhile is removed. ``None`` when
    another close accepted it first, or took this sweep over (settled again then)."""
    sid, acct = shard.shard_id, kinds[-1]
    phase, error = problem
    uri = layout.accepted(r, sid, acct)
    mine = QuarantinedJob(
        shard_id=sid, kind=acct, sweep=SWEEPING, phase=phase, error=error, quarantined_at=time.time()
    )
    stood, won = claim(uri, seen, mine, so)
    if not isinstance(stood, QuarantinedJob):
        return None
    if not won and stood.sweeping:  # another close's quarantine, still sweeping: wait for it
        return Sweeping(stood)
    if not won:  # another close's quarantine: it swept and removed
        return adopt_quarantine(layout, r, shard, stood, checked, so)
    orphans = _sweep_quarantined(layout, r, shard, kinds, checked, rerun, final, stood, so)
    if orphans is not None:
        record = _quarantine(layout, r, shard, phase, error, orphans, so)
        if claim(uri, stood, mine.model_copy(update={"sweep": SWEPT, "orphans_removed": orphans}), so)[1]:
            return Settled(shard, _feed_docs(checked, acct), None, record, orphans)
    log.warning("round %d: shard %s: another close took over its quarantine: settling it again", r, sid)
    return None


def _still(uri: str, doc: QuarantinedJob, so: StorageOptions | None) -> Callable[[], bool]:
    """Whether ``doc`` is still the decision at ``uri``: read again before each destructive step."""
    return lambda: read_accepted(uri, so) == doc


def _sweep_quarantined(
    layout: RunLayout,
    r: int,
    shard: PlannedShard,
    kinds: tuple[JobKind, ...],
    checked: list[Checked],
    rerun: bool,
    final: dict[str, str],
    doc: QuarantinedJob,
    so: StorageOptions | None,
) -> list[str] | None:
    """The destructive steps of a quarantine, each once this close's sweeping ``doc`` is read back
    as the decision; returns the orphans removed, or ``None`` when it no longer stands (a close that
    took this one for gone decided since: what that close accepted is never removed)."""
    sid, acct = shard.shard_id, kinds[-1]
    still = _still(layout.accepted(r, sid, acct), doc, so)
    # a re-run recomputes the accounting job, and a job before it whose attempt is gone
    removed = {
        x.kind for x in checked if x.manifest is not None and rerun and (x.kind == acct or _lost(x, so))
    }
    for kind in removed:
        if not still():
            return None
        files.remove(layout.job_manifest(r, sid, kind), so)
    keep = {
        posixpath.dirname(u)
        for x in checked
        if x.manifest_current and x.manifest is not None and x.kind not in removed
        for u in (x.manifest.committed or {}).values()
    }
    swept = _sweep_staged(layout, r, sid, kinds, keep, still, so)
    if swept is None:
        return None
    if swept:
        log.info("round %d: shard %s is quarantined: swept staged attempts %s", r, sid, ", ".join(swept))
    orphans = [final[name] for name in FENCED_OUTPUTS if files.exists(final[name], so)]
    for uri in orphans:
        if not still():
            return None
        files.remove(uri, so)
    if orphans:
        log.warning(
            "round %d: shard %s is quarantined: removed outputs no accepted job produced: %s",
            r,
            sid,
            ", ".join(orphans),
        )
    return orphans if still() else None  # its failed/ record is written next


def adopt_quarantine(
    layout: RunLayout,
    r: int,
    shard: PlannedShard,
    stood: QuarantinedJob,
    checked: list[Checked],
    so: StorageOptions | None,
) -> Settled:
    """The quarantine another close decided, as it recorded it (that close removes what it named)."""
    orphans = list(stood.orphans_removed or [])
    record = _quarantine(layout, r, shard, stood.phase, stood.error, orphans, so)
    return Settled(shard, _feed_docs(checked, stood.kind), None, record, orphans)


def _feed_docs(checked: list[Checked], acct: str) -> list[Figures]:
    """The current docs of a quarantined shard's jobs before the accounting one (their figures count)."""
    return [x.doc for x in checked if x.doc is not None and x.kind != acct]


def _sweep_staged(
    layout: RunLayout,
    r: int,
    sid: str,
    kinds: Iterable[str],
    keep: set[str],
    still: Callable[[], bool],
    so: StorageOptions | None,
) -> list[str] | None:
    """Remove a quarantined shard's staged attempts but those in ``keep`` (attempt folders), each
    once ``still()``; returns the folders removed (``None``: stopped, the quarantine no longer
    stands). A copy still writing into one fails, and its task's retry runs it anew."""
    swept = []
    for kind in kinds:
        job_dir = layout.staged_job(r, sid, kind)
        for token in files.names(job_dir, so):
            attempt = join(job_dir, token)
            if attempt not in keep:
                if not still():
                    return None
                files.remove_tree(attempt, so)
                swept.append(attempt)
    return swept


def _lost(x: Checked, so: StorageOptions | None) -> bool:
    """Whether a job's manifest names staged files that are gone (and were not promoted by close)."""
    committed = ((x.manifest.committed if x.manifest else None) or {}).values()
    return not x.kept and any(not files.exists(u, so) for u in committed)


def _quarantine(
    layout: RunLayout,
    r: int,
    shard: PlannedShard,
    phase: str,
    error: str,
    orphans: list[str],
    so: StorageOptions | None,
) -> FailedShard:
    """A shard whose ``phase`` job exhausted its retries: its whole input is recorded in ``failed/``."""
    sid = shard.shard_id
    if orphans:
        error += f" (removed outputs no accepted job produced: {', '.join(orphans)})"
    record = FailedShard(
        shard_id=sid,
        uri=shard.uri,
        records=shard.records,
        round=r,
        phase=phase,
        error=error,
        orphans_removed=orphans,
        remedy="fix the cause, then re-run the DAG run (finished shards are not run again)",
        # round 0 read in place: the shard is these bytes of the source
        range=list(shard.range_ref.range) if shard.range_ref is not None else None,
        ids=Digest.of(shard.ref.ids) if shard.ref.ids is not None else None,  # what it accounts for
    )
    write_failed(layout, record, so)
    log.error("round %d: shard %s quarantined (%s): %s", r, sid, phase, record.error)
    return record  # ranges.settle_range and settle_repeats may add to it (the ids as read, its repeats)
