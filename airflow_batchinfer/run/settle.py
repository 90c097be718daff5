"""Settling one shard of a round at close: its jobs' manifests checked against the round's current
settings and input versions, then accepted once (the accepted attempts' staged outputs promoted)
or the shard quarantined (:mod:`~airflow_batchinfer.run.quarantine`)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input, spec_input_info
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.run.accepted import (
    Checked,
    Doc,
    Figures,
    Settled,
    Sweeping,
    accepted_doc,
    claim,
    log_claim,
)
from airflow_batchinfer.run.jobs import inferred_shard, job_spec
from airflow_batchinfer.run.quarantine import adopt_quarantine, await_sweep, quarantine_shard
from airflow_batchinfer.run.repeats import drop_repeats
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    JobManifest,
    QuarantinedJob,
    read_accepted,
    read_job_error,
    read_job_manifest,
)
from airflow_batchinfer.state.layout import INFERRED, RunLayout, staged_attempt
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage import files
from airflow_batchinfer.storage.id_hashes import Repeat, rejects_uri
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.parquet_columns import pinned
from airflow_batchinfer.storage.parquet_schema import Inputs
from airflow_batchinfer.storage.record_file import convert, is_parquet

log = logging.getLogger("airflow_batchinfer.run")


STALE = (
    "{uri} was written under other settings or for another input version: re-run the DAG run to recompute it"
)


CLAIM_TRIES = 3  # settles of one shard when concurrent closes keep changing its decision


@dataclass(frozen=True)
class RoundClose:
    """What every shard's settle in one round's close shares.

    :ivar cfg: the settings the round ran (its plan's).
    :ivar kinds: the round's job kinds; the last one accounts for the shard.
    :ivar engines: what ran each kind (a judge with its own pool: that pool's engine); ``None``: not
        recorded by the plan.
    :ivar already_failed: the ``failed/`` records an earlier close left (``<shard>.json``).
    """

    cfg: RunConfig
    layout: RunLayout
    r: int
    kinds: tuple[JobKind, ...]
    engines: Mapping[str, dict[str, Any] | None]
    already_failed: frozenset[str]
    so: StorageOptions | None

    @functools.cached_property
    def inputs(self) -> Inputs:
        """The run's pinned input columns, for the Parquet files its promotions write (read once)."""
        parquet = self.cfg.data.output_format == "parquet"
        return pinned(self.layout.output_columns, self.so) if parquet else ()


def settle_shard(rc: RoundClose, shard: PlannedShard, repeats: list[Repeat] | None = None) -> Settled:
    """Check one shard's jobs against the current settings (and ``engines``, what the round's
    pools run per job kind, where the plan recorded it), then accept them once (promoting the
    accepted attempts' staged outputs: the accounting job's, and the infer attempt its judge read)
    or quarantine the shard. Every decision is a compare-and-swap of the accounting job's accepted
    doc from what this close read (:func:`claim`): of two closes at once, the one that loses adopts
    the decision that stands, never its own. A quarantine another close is still sweeping is never
    replaced: this close waits for its end (:func:`await_sweep`), then settles from it."""
    uri = rc.layout.accepted(rc.r, shard.shard_id, rc.kinds[-1])
    stale: QuarantinedJob | None = None  # a sweep whose close is taken for gone: may be replaced
    repeated = repeats or []
    for _ in range(CLAIM_TRIES):
        settled = _settle_once(rc, shard, repeated, stale)
        if isinstance(settled, Settled):
            return settled
        stale = await_sweep(uri, settled.doc, rc.so) if isinstance(settled, Sweeping) else None
    raise StorageError(
        f"round {rc.r}: shard {shard.shard_id}: {CLAIM_TRIES} closes at once kept deciding {uri} "
        "differently; run only one close of the round at a time, then re-run it"
    )


def _settle_once(
    rc: RoundClose, shard: PlannedShard, repeats: list[Repeat], stale: QuarantinedJob | None
) -> Settled | Sweeping | None:
    """One try of :func:`settle_shard`; ``None`` when another close changed the decision while this one
    made its own (settled again then, from what that close decided); :class:`Sweeping` when another
    close's quarantine is still sweeping (but ``stale``, one taken for gone)."""
    cfg, layout, r, kinds, so = rc.cfg, rc.layout, rc.r, rc.kinds, rc.so
    sid = shard.shard_id
    acct = kinds[-1]
    final = job_spec(cfg, acct, r, shard).outputs  # the outputs' final URIs (they do not depend on input)
    accepted_uri = layout.accepted(r, sid, acct)
    checked: list[Checked] = []
    for kind in kinds:
        checked.append(_check_job(rc, shard, kind))
        if checked[-1].problem is not None:
            break
    last = checked[-1]
    seen = last.seen if last.kind == acct else read_accepted(accepted_uri, so)
    if isinstance(seen, QuarantinedJob) and seen.sweeping and seen != stale:
        return Sweeping(seen)  # no decision replaces it: its sweep could remove what it moves
    replaces_quarantine = isinstance(seen, QuarantinedJob)  # its failed/ record goes if accepted
    problem = None if last.problem is None else (last.kind, last.problem)
    rerun = False  # a current manifest is unusable: delete it so a re-run recomputes
    stood: Doc | None = None  # the accounting job's accepted doc (earlier, or now)
    if problem is None and last.kept:
        assert isinstance(last.doc, AcceptedJob)
        stood = last.doc  # accepted earlier for these settings: a later copy never replaces it
    elif problem is None:
        assert isinstance(last.doc, JobManifest)
        committed = (last.doc.committed or {}).values()
        missing = [u for u in committed if not files.exists(u, so)]
        if missing:
            problem = (
                acct,
                f"the staged outputs of attempt {last.doc.attempt} are missing "
                f"({', '.join(missing)}): re-run the DAG run to recompute them",
            )
            rerun = True
        else:  # first the decision, then the moves (redone if cut short)
            mine = accepted_doc(last.doc, sid, acct, final, layout.job_manifest(r, sid, acct), so)
            # ids an earlier range holds are left out of what is accepted (rejects/: settle_repeats)
            mine = drop_repeats(
                mine, repeats, cfg.data.id_field or "id", rejects_uri(layout.rejects, sid), so
            )
            stood, won = claim(accepted_uri, seen, mine, so)
            replaces_quarantine = replaces_quarantine and won
            seen = stood
            log_claim(r, sid, stood, won, mine)
    if isinstance(stood, QuarantinedJob):  # another close quarantined it meanwhile (maybe still sweeping)
        return Sweeping(stood) if stood.sweeping else adopt_quarantine(layout, r, shard, stood, checked, so)
    if stood is not None:
        jobs, problem = _accept_feeds(layout, r, shard, checked[:-1], stood, so)
        id_field = cfg.data.id_field or "id"
        docs = [*jobs, stood] if problem is None else []
        lost = [u for doc in docs for u in _promote(doc, so, id_field, rc.inputs)]
        if lost:
            problem = (
                acct,
                f"the accepted outputs {', '.join(lost)} of attempt {stood.attempt} are "
                "missing: re-run the DAG run to recompute them",
            )
            rerun = True
        if problem is None:
            for kind in kinds:  # other copies' attempts: never promoted
                files.remove_tree(layout.staged_job(r, sid, kind), so)
            # quarantined by an earlier close (or by one during this one); its job has finished since
            if f"{sid}.json" in rc.already_failed or replaces_quarantine:
                files.remove(join(layout.failed(r), f"{sid}.json"), so)
                log.info("round %d: shard %s accepted: its quarantine record is removed", r, sid)
            return Settled(shard, [*jobs, stood], stood.counts, accepted=stood)
    assert problem is not None
    return quarantine_shard(layout, r, shard, kinds, checked, problem, rerun, seen, final, so)


def _check_job(rc: RoundClose, shard: PlannedShard, kind: JobKind) -> Checked:
    """One job's accepted doc and manifest, each checked against the current settings."""
    layout, r, so = rc.layout, rc.r, rc.so
    sid = shard.shard_id
    manifest_uri = layout.job_manifest(r, sid, kind)
    m = read_job_manifest(manifest_uri, so)
    seen = read_accepted(layout.accepted(r, sid, kind), so)
    prior = seen if isinstance(seen, AcceptedJob) else None
    x = Checked(kind, m, seen, manifest_current=_current(rc, shard, kind, m))
    if _current(rc, shard, kind, prior):
        x.doc = prior
    elif x.manifest_current:
        x.doc = m
    else:
        note = read_job_error(layout.job_error(r, sid, kind), so)
        error = note.error if note is not None else None
        if m is None:
            x.problem = error or "the job never completed (no completion manifest)"
        else:
            x.problem = STALE.format(uri=manifest_uri) + (f"; last error: {error}" if error else "")
    return x


def _current(rc: RoundClose, shard: PlannedShard, kind: JobKind, doc: Figures | None) -> bool:
    """Whether ``doc`` (a manifest or an accepted doc) is the job the current settings ask for: its job
    id and fingerprint recomputed from its input's version. A judge's input is the inferred file its
    doc names, when that is this shard's (see :func:`_judge_read`)."""
    if doc is None:
        return False
    cfg, r, engine = rc.cfg, rc.r, rc.engines.get(kind)
    src = shard
    if kind == "judge":
        read = _judge_read(rc.layout, r, shard.shard_id, doc)
        if read is None:
            return False
        inferred = inferred_shard(cfg, r, shard)
        src = inferred.with_ref(inferred.ref.model_copy(update={"uri": read}))
    spec = job_spec(cfg, kind, r, src)
    try:
        info: dict[str, Any] | None = spec_input_info(spec, rc.so)  # a part shard's: its pieces
    except FileNotFoundError:
        info = None
    if info is None and kind == "judge" and isinstance(doc, AcceptedJob):
        info = doc.input_info  # the infer attempt it read, moved to inferred/ since
    if info is None:
        return False
    pinned = pin_input(spec, info)
    return (
        doc.job_id == pinned.job_id
        and (engine is None or doc.engine == engine)
        and doc.fingerprint == fingerprint(pinned, doc.engine or {}, info)
    )


def _judge_read(layout: RunLayout, r: int, sid: str, doc: Figures) -> str | None:
    """The inferred file a judge's manifest or accepted doc says the judge read, when it is this
    shard's: the final ``inferred/`` file, or one attempt its infer job staged."""
    final = layout.inferred(r, sid)
    read = doc.input
    ours = read == final or staged_attempt(layout.staged_job(r, sid, "infer"), read, INFERRED) is not None
    return read if ours else None


def _accept_feeds(
    layout: RunLayout,
    r: int,
    shard: PlannedShard,
    feeds: list[Checked],
    stood: AcceptedJob,
    so: StorageOptions | None,
) -> tuple[list[Figures], tuple[str, str] | None]:
    """Accept the jobs before the accounting one (an infer job before its judge): the attempt the
    accepted judge read, whatever a later copy wrote since, claimed once as the judge's doc is."""
    sid = shard.shard_id
    docs: list[Figures] = []
    for x in feeds:
        assert x.doc is not None
        final = layout.inferred(r, sid)
        read = _judge_read(layout, r, sid, stood)
        attempt = (x.doc.committed or {}).get(INFERRED) or final
        if x.kept and read not in (final, attempt):
            return docs, (
                x.kind,
                f"its judge read {read}, not the attempt {x.doc.attempt} of "
                f"{layout.job_manifest(r, sid, x.kind)} close accepted earlier: re-run the "
                "DAG run to recompute the judge",
            )
        if x.kept:
            docs.append(x.doc)
            continue
        if read is None:  # validated when it was accepted: a doc edited by hand since
            return docs, (
                x.kind,
                f"{layout.accepted(r, sid, 'judge')} names an input that is not this "
                "shard's inferred file: delete it and re-run the DAG run",
            )
        assert isinstance(x.doc, JobManifest)
        mine = accepted_doc(x.doc, sid, x.kind, {INFERRED: final}, layout.job_manifest(r, sid, x.kind), so)
        token = staged_attempt(layout.staged_job(r, sid, x.kind), read, INFERRED)
        if token is None:  # the judge read the final file: written in place, or promoted earlier
            mine.committed = {}
        elif token != mine.attempt:  # a later copy rewrote the manifest: the judge's read stands
            mine.attempt, mine.committed, mine.manifest_attempt = token, {INFERRED: read}, mine.attempt
        doc, won = claim(layout.accepted(r, sid, x.kind), x.seen, mine, so)
        log_claim(r, sid, doc, won, mine)
        assert isinstance(doc, AcceptedJob)  # only the accounting job's doc is ever a quarantine
        docs.append(doc)
    return docs, None


def _promote(doc: Figures, so: StorageOptions | None, id_field: str, inputs: Inputs) -> list[str]:
    """Move the accepted attempt's staged outputs to their final URIs; a final URI in Parquet
    (``output_format``) gets the staged JSONL rows converted (atomically, then the staged file
    removed), its ``id`` column the ``id_field``'s, its input columns ``inputs``. Idempotent: an
    output whose staged file is gone was moved by an earlier close, or by another close at once (a
    job without staging wrote it in place). Returns the outputs found nowhere."""
    lost = []
    committed = doc.committed or {}
    for name, dst in doc.outputs.items():
        staged = committed.get(name)
        if staged and files.exists(staged, so):
            with contextlib.suppress(FileNotFoundError):  # moved by a concurrent close just now
                if is_parquet(dst) and not is_parquet(staged):
                    convert(staged, dst, storage_options=so, id_field=id_field, inputs=inputs)
                else:
                    files.move(staged, dst, so)
        if not files.exists(dst, so):
            lost.append(dst)
    return lost
