"""Closing a round: every shard the plan ran settled (:mod:`~airflow_batchinfer.run.settle`), the id
invariant checked from digests, the rejected set recompacted into the next round's pending set and
``summary.json`` written. Shared by the Airflow operators and ``batchinfer run``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.run.accepted import Settled
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.ranges import close_input_ranges, settle_range
from airflow_batchinfer.run.repeats import REPEATED, fanned, range_repeats, settle_repeats
from airflow_batchinfer.run.settle import RoundClose, settle_shard
from airflow_batchinfer.run.usage_rounds import round_span, run_usage, with_summary_spans
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AdapterApproval,
    Candidates,
    Digest,
    Invariant,
    Jury,
    Plan,
    Summary,
    WorkerTotals,
    read_summary,
    write_summary,
)
from airflow_batchinfer.state.docs.usage_account import UsageAccount
from airflow_batchinfer.state.layout import FENCED_OUTPUTS, RunLayout, output_stem
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage import JsonlDir, JsonlFile, files
from airflow_batchinfer.storage.digest import IdDiff, IdDigest, diff_ids, file_digest, file_ids
from airflow_batchinfer.storage.id_hashes import Repeats
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.ranges import range_ids
from airflow_batchinfer.storage.recompact import recompact
from airflow_batchinfer.storage.record_file import RecordFile, record_file

log = logging.getLogger("airflow_batchinfer.run")


WORKER_FIELDS = tuple(WorkerTotals.model_fields)  # a summary's figures per worker (the report adds them up)


MAX_NAMED = 20  # ids named per list (lost, doubled, unexpected) in a summary or the report


def close_round(cfg: RunConfig, plan: Plan, so: StorageOptions | None = None) -> dict[str, Any] | None:
    """Account for every shard the plan ran, accepting each shard's outputs once.

    Per shard (8 threads): every job's completion manifest must match the round's *current* settings
    and input versions (job id and fingerprint recomputed); the accounting job (judge, or in_place)
    is then accepted once: ``jobs/<shard>.<kind>.accepted.json`` records the attempt, and that
    attempt's staged outputs are moved to ``results/`` and ``rejected/`` (a copy that finishes later is
    never promoted). A shard without a valid manifest is quarantined into ``failed/`` and any final
    output close did not promote is removed. Then: check the counts, recompact the rejected set into
    the next round's pending set and write ``summary.json``. ``None`` for a skipped slot. Re-running
    it is safe: accepted shards stay as they are, and a quarantined shard whose job has since
    finished is accepted then.

    The id invariant is checked from digests, in O(shards) and without reading a row: per shard, the
    plan's digest of its ids must equal the accepted job's approved + rejected digests (a quarantined
    shard accounts for its whole planned digest), and the recompacted next pending set's digest
    must equal the rejected files' sum. Only a shard whose digests disagree, or that has none (a
    range shard's plan, before its job read it), is opened: its ids are read and the lost, doubled or
    unexpected ones named (as is the rejected set when the recompaction's digest disagrees)."""
    if plan.mode == "skip":
        return None
    cfg = plan.effective_config(cfg)  # the settings the round ran, as its plan carries them
    layout = RunLayout(cfg.run_root)
    settled = _settle_all(cfg, layout, plan, so)
    close_input_ranges(layout, settled, so)
    orphans = [u for x in settled for u in x.orphans] + _remove_unplanned(layout, plan.round, plan, so)
    ids = _Ids.of(settled)
    tally = sum((x.counts for x in settled if x.counts is not None), Tally())
    if plan.mode == "rounds":
        found = _account_rounds(cfg, layout, plan.round, settled, tally, ids, so)
    else:
        found = _account_in_place(settled, tally, ids)
    summary = _summary(plan, settled, tally, ids, found, orphans)
    summary.usage = _usage(layout, summary, settled, so)
    write_summary(layout, summary, so)
    if not summary.invariant.ok:
        log.error(
            "round %d: %d records planned but %d accounted for; ids lost %s, doubled %s, unexpected %s",
            plan.round,
            summary.invariant.planned,
            summary.invariant.accounted,
            summary.invariant.lost,
            summary.invariant.doubled,
            summary.invariant.unexpected,
        )
    return summary.to_json()  # what XCom carries: the stored form


def _settle_all(cfg: RunConfig, layout: RunLayout, plan: Plan, so: StorageOptions | None) -> list[Settled]:
    """Every shard the plan ran settled (8 threads): accepted once, or quarantined; its repeats
    (round 0's ranges) left out, its segments removed once settled, its ids accounted for."""
    r = plan.round
    kinds = round_kinds(cfg, plan.mode)
    # What ran each kind: a judge with its own pool is checked against that pool's engine.
    engines: dict[str, dict[str, Any] | None] = {
        k: plan.judge_engine if k == "judge" else plan.engine for k in kinds
    }
    already_failed = frozenset(files.names(layout.failed(r), so))
    rc = RoundClose(cfg, layout, r, kinds, engines, already_failed, so)
    id_field = cfg.data.id_field or "id"

    def settle(shard: PlannedShard) -> Settled:
        # later occurrences of ids an earlier range holds (a fan-out's: each of their rows)
        repeated = fanned(shard, repeats.of(shard.shard_id))
        x = settle_shard(rc, shard, repeated)
        x = settle_range(cfg, layout, r, x, so)
        settle_repeats(layout, r, x, repeated, id_field, so)
        if x.accepted is not None:  # settled by its manifest: segments its job left have served
            for kind in kinds:  # (a quarantined shard's are kept: a re-run of the round resumes them)
                if kind != "in_place":
                    files.remove_tree(layout.segments(r, shard.shard_id, kind), so)
        return _account(x, id_field, so, cfg.data.assign_ids)

    # before any shard is accepted: the repeats are left out of what it accepts
    with range_repeats(cfg, layout, so) if r == 0 else Repeats() as repeats, ThreadPoolExecutor(8) as ex:
        return list(ex.map(settle, plan.shards))


@dataclass
class _Ids:
    """The round's id digests: of the rows it planned, of its quarantined shards' (each accounts for
    its whole input) and of each output of its accepted shards (and their left-out repeats)."""

    planned: IdDigest
    failed: IdDigest
    outputs: dict[str, IdDigest]
    diffs: list[IdDiff]  # the ids named where shards' (or the recompaction's) digests disagreed

    @classmethod
    def of(cls, settled: list[Settled]) -> _Ids:
        ids = cls(IdDigest(), IdDigest(), {n: IdDigest() for n in (*FENCED_OUTPUTS, REPEATED)}, [])
        for x in settled:
            ids.planned += x.planned
            if x.outputs is None:
                ids.failed += x.planned  # a quarantined shard accounts for its whole input
            else:
                for name, d in x.outputs.items():
                    ids.outputs[name] += d
            if x.diff is not None:
                ids.diffs.append(x.diff)
        return ids

    def consistent(self) -> bool:
        """Whether the planned ids are the outputs', the quarantined shards' and the repeats' (a
        repeat rejected into rejects/ was read, and digested, by its range's job: it counts as a line)."""
        out = self.outputs
        return self.planned == out["approved"] + out["rejected"] + self.failed + out[REPEATED]


@dataclass
class _Accounted:
    """Where a round's rows went, by its mode: ``accounted`` for (approved, rejected or exhausted,
    quarantined, left out as repeats), the summary's digest per set, whether the next pending set
    holds exactly the rejected rows, and the mode's own figures."""

    accounted: int
    ids: dict[str, IdDigest]
    recompacted_ok: bool = True
    rejected: int | None = None
    inference_errors: int | None = None
    for_review: int | None = None
    next_pending: int | None = None
    exhausted: int | None = None
    attempts: int | None = None


def _failed_records(settled: list[Settled]) -> int:
    return sum(x.failed.records for x in settled if x.failed is not None)


def _account_rounds(
    cfg: RunConfig,
    layout: RunLayout,
    r: int,
    settled: list[Settled],
    tally: Tally,
    ids: _Ids,
    so: StorageOptions | None,
) -> _Accounted:
    """Strategy 1: the rejected rows recompacted into the next round's pending set, whose digest must
    be the rejected files' (both are read, and the ids that differ named, when it is not)."""
    id_field = cfg.data.id_field or "id"
    out = ids.outputs
    outcomes = tally.outcomes
    judged = {x.shard.shard_id: x.counts.outcomes.rejected for x in settled if x.counts is not None}
    nxt = recompact(
        layout.rejected_dir(r),
        layout.pending(r + 1),
        records_per_shard=cfg.sharding.records_per_shard,
        counts=judged,
        workers=8,
        storage_options=so,
        overwrite=True,
        id_field=id_field,
    )
    next_ids = IdDigest.maybe(nxt.ids)
    if next_ids is None:  # recompact digests the ids it writes: this output was made without them
        raise StorageError(
            f"{layout.pending(r + 1)} holds a recompaction without its ids' digest (made without an id "
            "field); delete it so this round's close recompacts the rejected rows again"
        )
    if next_ids != out["rejected"]:
        log.error("round %d: the next pending set's ids differ from the rejected files': reading both", r)
        rejected_dir = JsonlDir(layout.rejected_dir(r), storage_options=so)
        sources = [rejected_dir.file(s.name) for s in rejected_dir.shards()]
        targets: list[RecordFile] = [JsonlFile(d.uri, storage_options=so) for d in nxt.shards]
        ids.diffs.append(_diff(sources, targets, id_field))
    return _Accounted(
        accounted=outcomes.approved + outcomes.rejected + _failed_records(settled) + out[REPEATED].count,
        ids={
            "planned": ids.planned,
            "approved": out["approved"],
            "rejected": out["rejected"],
            "failed": ids.failed,
            "next_pending": next_ids,
            REPEATED: out[REPEATED],
        },
        recompacted_ok=nxt.records == outcomes.rejected and next_ids == out["rejected"],
        rejected=outcomes.rejected,
        inference_errors=outcomes.inference_errors,
        for_review=outcomes.for_review,  # rejected rows that await people
        next_pending=nxt.records,
    )


def _account_in_place(settled: list[Settled], tally: Tally, ids: _Ids) -> _Accounted:
    """Strategy 2 (and a tail): every row approved or exhausted (its attempts, or its prompt, failed)."""
    outcomes, out = tally.outcomes, ids.outputs
    exhausted = outcomes.max_attempts + outcomes.error
    return _Accounted(
        accounted=outcomes.approved + exhausted + _failed_records(settled) + out[REPEATED].count,
        ids={
            "planned": ids.planned,
            "approved": out["approved"],
            "exhausted": out["rejected"],
            "failed": ids.failed,
            REPEATED: out[REPEATED],
        },
        exhausted=exhausted,
        attempts=outcomes.attempts,
    )


def _usage(
    layout: RunLayout, summary: Summary, settled: list[Settled], so: StorageOptions | None
) -> UsageAccount:
    """The run's GPU-seconds up to this close: this round's span from its jobs, the earlier
    rounds' from their summaries (:mod:`airflow_batchinfer.run.usage_rounds`)."""
    jobs = (m for x in settled for m in x.jobs)
    this = round_span(summary.slot, summary.round, jobs, summary.workers)
    before = [s for r in range(summary.round) if (s := read_summary(layout, r, so))]
    return run_usage(layout, with_summary_spans(before, this), so)


def _work(settled: list[Settled]) -> tuple[dict[str, int], float, dict[str, WorkerTotals]]:
    """The tokens, job seconds and per-worker figures of every job that counts, infer and judge alike."""
    tokens: dict[str, int] = {}
    job_seconds = 0.0
    workers: dict[str, WorkerTotals] = {}
    for m in (m for x in settled for m in x.jobs):
        run_s = m.timings.run_s
        for k, v in m.tokens.items():
            tokens[k] = tokens.get(k, 0) + v
        job_seconds += run_s
        w = workers.setdefault(m.worker, WorkerTotals())
        w.jobs += 1
        w.job_seconds += run_s
        w.engine_busy_s += m.batcher.busy_s
        w.fill_sum += m.batcher.avg_fill
        w.tokens += sum(m.tokens.values())
    return tokens, job_seconds, workers


def _summary(
    plan: Plan, settled: list[Settled], tally: Tally, ids: _Ids, found: _Accounted, orphans: list[str]
) -> Summary:
    """The round's ``summary.json``: its figures from the summed tally, its work, and the invariant."""
    assert plan.mode != "skip"  # a skipped slot has none
    pending = sum(x.shard.records for x in settled)  # a range shard's, as read
    failed = [x.failed for x in settled if x.failed is not None]
    tokens, job_seconds, workers = _work(settled)
    named = {k: _named([getattr(d, k) for d in ids.diffs]) for k in ("lost", "doubled", "unexpected")}
    approved = tally.outcomes.approved
    ok = found.accounted == pending and found.recompacted_ok and ids.consistent() and not any(named.values())
    return Summary(
        round=plan.round,
        slot=plan.slot,
        mode=plan.mode,
        pending=pending,
        shards=len(plan.shards),
        approved=approved,
        failed_shards=failed,
        failed_records=sum(f.records for f in failed),
        orphans_removed=orphans,
        tokens=tokens,
        job_seconds=round(job_seconds, 3),
        workers=workers,
        rejected=found.rejected,
        inference_errors=found.inference_errors,
        for_review=found.for_review,
        next_pending=found.next_pending,
        exhausted=found.exhausted,
        attempts=found.attempts,
        truncated=tally.truncated,
        truncated_in_thinking=tally.truncated_in_thinking or None,
        candidates=_candidates(tally),
        adapters=_adapters(tally),
        spot_checks=(tally.outcomes.spot_checks or None) if plan.mode == "rounds" else None,
        verdicts=tally.verdicts(),
        jury=_jury(tally),
        repeated_ids=ids.outputs[REPEATED].count,
        approval_rate=round(approved / pending, 4) if pending else None,
        ids={k: Digest.of(v) for k, v in found.ids.items()},  # count and digest of each set's ids
        invariant=Invariant(
            planned=pending,
            accounted=found.accounted,
            ok=ok,
            lost=named["lost"],
            doubled=named["doubled"],
            unexpected=named["unexpected"],
            opened=[x.shard.shard_id for x in settled if x.opened],  # shards whose ids were read
        ),
    )


def _candidates(tally: Tally) -> Candidates | None:
    found = tally.candidates.stats()
    return None if found is None else Candidates.model_validate(found.as_json())


def _adapters(tally: Tally) -> dict[str, AdapterApproval] | None:
    """Approval per adapter: the judge's, its spot checks held for people among its approvals (as the
    round's approval share counts them: undecided, they follow the judge into results); ``spot_checks``
    only where there are some."""
    out = {}
    for name, c in sorted(tally.adapters.items()):
        rate = round((c.approved + c.spot_checks) / max(1, c.approved + c.rejected + c.spot_checks), 4)
        held = {"spot_checks": c.spot_checks} if c.spot_checks else {}
        out[name] = AdapterApproval(approved=c.approved, rejected=c.rejected, **held, approval_rate=rate)
    return out or None


def _jury(tally: Tally) -> Jury | None:
    found = tally.jury.stats()
    return None if found is None else Jury.model_validate(found.as_json())


def _named(lists: list[list[Any]]) -> list[Any]:
    """Ids named by several diffs, once each, at most :data:`MAX_NAMED`."""
    return list(dict.fromkeys(i for ids in lists for i in ids))[:MAX_NAMED]


def _diff(expected: list[RecordFile], actual: list[RecordFile], id_field: str) -> IdDiff:
    """The ids that differ between two sets of files, read in bounded memory (:func:`diff_ids`)."""
    return diff_ids(lambda: file_ids(expected, id_field), lambda: file_ids(actual, id_field), limit=MAX_NAMED)


def _account(x: Settled, id_field: str, so: StorageOptions | None, assign_ids: bool = False) -> Settled:
    """The id accounting of one settled shard, from digests where they agree.

    The shard's planned digest is its ref's ``ids`` (the writer of the pending set recorded
    it), else the digest its first job read (``ids.input``). An accepted shard is consistent when
    that equals the accepted job's approved + rejected digests; otherwise, or with no digests at all
    (a range shard no job read to its end), its input and final output files are read: their real
    digests are used, and the ids that differ are named. A quarantined shard accounts for its
    planned digest (read from its input file when the plan has none)."""
    shard = x.shard
    planned = shard.ref.ids.copy() if shard.ref.ids is not None else None
    if x.counts is None or x.accepted is None:
        if planned is None:
            planned, x.opened = file_digest(JsonlFile(shard.uri, storage_options=so), id_field), True
        x.planned = planned
        return x
    if planned is None and x.jobs:
        planned = x.jobs[0].digest("input")
    left_out = x.accepted.repeats  # repeats rejected into rejects/: lines its job read too
    names = (*FENCED_OUTPUTS, REPEATED) if left_out is not None else FENCED_OUTPUTS
    outputs = {name: x.accepted.digest(name) for name in names}
    if planned is not None and None not in outputs.values():
        x.planned, x.outputs = planned, {k: v for k, v in outputs.items() if v is not None}
        if planned == sum(x.outputs.values(), IdDigest()):
            return x  # the common case: nothing is read
    sid = shard.shard_id
    finals = {name: record_file(x.accepted.outputs[name], storage_options=so) for name in FENCED_OUTPUTS}
    if left_out is not None:  # its reject rows carry the id
        finals[REPEATED] = JsonlFile(left_out.rejects, storage_options=so)
    source = JsonlFile(shard.uri, storage_options=so)

    rng = shard.range_ref

    def source_ids() -> Iterator[Any]:  # a round-0 range: just its range, validated as its job read it
        if rng is not None:
            return range_ids(rng, id_field=id_field, assign_ids=assign_ids, storage_options=so)
        return file_ids([source], id_field)

    read = IdDigest.of(source_ids()) if rng is not None else file_digest(source, id_field)
    x.outputs = {name: file_digest(f, id_field) for name, f in finals.items()}
    x.planned, x.opened = planned if planned is not None else read, True
    found = sum(x.outputs.values(), IdDigest())
    if found != x.planned or read != x.planned:
        x.diff = diff_ids(source_ids, lambda: file_ids(list(finals.values()), id_field), limit=MAX_NAMED)
        log.error(
            "shard %s: its outputs do not hold its ids once each: lost %s, doubled %s, unexpected %s",
            sid,
            x.diff.lost,
            x.diff.doubled,
            x.diff.unexpected,
        )
    elif planned is None or outputs != x.outputs:
        log.info("shard %s: ids checked by reading its files (its manifest has no or other digests)", sid)
    return x


def _remove_unplanned(layout: RunLayout, r: int, plan: Plan, so: StorageOptions | None) -> list[str]:
    """Final outputs of this round for shards the plan does not name (an earlier plan's): orphans that
    would break the count check and the recompaction."""
    planned = {s.shard_id for s in plan.shards}
    prefix = f"round{r:02d}-" if plan.mode == "rounds" else "tail-"
    found = [
        join(layout.rejected_dir(r), n)
        for n in files.names(layout.rejected_dir(r), so)
        if (stem := output_stem(n)) is not None and stem not in planned
    ]
    found += [
        join(layout.results, n)
        for n in files.names(layout.results, so)
        if n.startswith(prefix)
        and (stem := output_stem(n)) is not None
        and stem[len(prefix) :] not in planned
    ]
    removed = [u for u in found if files.remove(u, so)]
    if removed:
        log.warning("round %d: removed outputs of shards the plan does not name: %s", r, ", ".join(removed))
    return removed
