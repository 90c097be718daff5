"""Reviewers' decisions take effect: when a review gate is answered, the round about to run splits
its pending set (the reviewed round's rejected rows, recompacted) by the decisions on those rows.

- **retry** (every row no decision names): stays pending, in ``round-NN/reviewed/`` (the round's
  pending set from then on: :func:`airflow_batchinfer.run.plan.pending_shards` prefers it); a row
  a retry decision names carries it (``sent_back``: who, when, the note, the round), and its next
  attempt's prompt may read the note (``previous.note``, :mod:`airflow_batchinfer.prompts.retries`);
- **accept**: into ``results/`` (``reviewed-rNN-<shard>``), marked ``accepted_by_review``, with
  who, when and the note in its ``judgment`` (below);
- **drop**: out of the run, into ``dropped/`` with the same record of the decision;
- a **spot check** no decision names (an approved row the judge job held back for people,
  ``spot_check_approved``) follows the judge: into ``results/`` (with the accepted rows), approved
  (counted per LoRA adapter too: the report's approval per adapter adds them to its round's).

A decided row records the person's verdict in its ``judgment``: ``person`` (``approved``: accept;
``action``, ``by``, ``at``, ``note``; ``bulk`` for a decision by filter) and ``overridden`` when it
differs from the judge's own verdict: the system's names (``judgment``, ``sent_back``,
``accepted_by_review``), never a field of the record's own (a record's ``review``, its product-review
text say, is kept as it was). The reviewers' verdicts beside the judge's give the round's
calibration (``round-NN/review/calibration.json``, :mod:`airflow_batchinfer.review.calibration`).

Every output file is written whole and the split's ids are digested per output, so the id invariant
holds from digests: pending = retained + accepted + dropped + approved (the spot checks that
followed the judge; the plan records the last three, the report counts them). Applying again (a
retried plan task) rewrites the same files from the same decisions, and removes what an earlier
application wrote that these decisions no longer make.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.engines.adapters import counted
from airflow_batchinfer.prompts.retries import SENT_BACK
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.calibration import (
    Pair,
    calibrate,
    judge_checked,
    judge_verdict,
    pair_of,
    scored_in_tenths,
)
from airflow_batchinfer.review.decisions import (
    FOLLOWS_JUDGE,
    Decision,
    DecisionLog,
    Outcome,
    Resolver,
    undecided,
)
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Digest, Summary, read_summary
from airflow_batchinfer.state.docs.calibration import write_calibration
from airflow_batchinfer.state.docs.reviewed import ReviewApplied
from airflow_batchinfer.state.layout import SHARD_SUFFIX, RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, files
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.fan_out import ADAPTER_FIELD
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.manifest import OutputManifest, write_manifest
from airflow_batchinfer.storage.parquet_columns import pinned
from airflow_batchinfer.storage.record_file import is_parquet, record_file
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef


@dataclass
class Applied:
    """What a round's decisions did to the next round's pending set."""

    reviewed_round: int
    decisions: int
    shards: list[ShardRef]  # the retained rows, per shard (the round's pending set now)
    # accept, retry, drop; approve (spot checks that followed the judge) when there were any
    counts: dict[str, int] = field(default_factory=lambda: {"accept": 0, "retry": 0, "drop": 0})
    accepted: IdDigest = field(default_factory=IdDigest)
    dropped: IdDigest = field(default_factory=IdDigest)
    approved: IdDigest = field(default_factory=IdDigest)  # undecided spot checks, into results
    # those per LoRA adapter (the report's approval per adapter adds them to its round's approved)
    approved_by_adapter: dict[str, int] = field(default_factory=dict)

    def doc(self) -> ReviewApplied:
        """What the split's manifest (``state.docs.review_applied``, which the report counts) and the
        plan (``Plan.reviewed``) record; ``approved`` only when spot checks followed the judge."""
        return ReviewApplied(
            round=self.reviewed_round,
            decisions=self.decisions,
            counts=dict(self.counts),
            accepted=Digest.of(self.accepted),
            dropped=Digest.of(self.dropped),
            approved=Digest.of(self.approved) if self.counts.get(FOLLOWS_JUDGE) else None,
            approved_by_adapter=dict(sorted(self.approved_by_adapter.items())) or None,
        )


def apply_decisions(
    cfg: RunConfig, r: int, pending: Sequence[ShardRef | RangeRef], so: StorageOptions | None = None
) -> Applied | None:
    """Split round ``r``'s ``pending`` shards by the decisions on round ``r - 1``'s rejected rows;
    ``None`` when there are none and no spot check waits (nothing is written)."""
    if r < 1:
        return None
    # sealed first: a decision recorded from now on is refused, not silently left out
    decisions = DecisionLog(cfg.run_root, r - 1, so).seal()
    last = read_summary(RunLayout(cfg.run_root), r - 1, so)
    if not decisions and not (last is not None and last.spot_checks):
        return None
    split = _Split(cfg, r, decisions, so)
    for shard in pending:
        split.shard(shard)
    split.finish(last)
    return split.applied


class _Split:
    """One application of round ``r - 1``'s decisions to round ``r``'s pending shards: what each
    row becomes, the files written, and the reviewers' verdicts beside the judge's."""

    def __init__(self, cfg: RunConfig, r: int, decisions: list[Decision], so: StorageOptions | None) -> None:
        self.cfg, self.r, self.reviewed, self.so = cfg, r, r - 1, so
        self.layout = RunLayout.of(cfg.run_root, cfg.data.output_format)  # what it writes: that format
        self.view = RoundView(cfg.run_root, self.reviewed, so)
        self.resolver = Resolver(decisions)
        self.id_field = cfg.data.id_field or "id"
        self.inputs = pinned(self.layout.output_columns, so) if is_parquet(self.layout.suffix) else ()
        self.tenths = scored_in_tenths(cfg.judging.judge)
        self.retained_dir = JsonlDir(self.layout.reviewed(r), storage_options=so)
        self.applied = Applied(self.reviewed, len(decisions), [])
        self.pairs: list[Pair] = []
        self.bulk = self.unjudged = 0
        self.made: set[str] = set()

    def shard(self, shard: ShardRef | RangeRef) -> None:
        """Split one pending shard: each row into the file of its outcome, its id into that
        outcome's digest."""
        sid, reviewed = shard.shard_id, self.reviewed
        digests: dict[Outcome, IdDigest] = {a: IdDigest() for a in ("accept", "retry", "drop", FOLLOWS_JUDGE)}
        uris: dict[Outcome, str] = {
            "retry": self.retained_dir.file(sid + SHARD_SUFFIX).uri,
            "accept": self.layout.review_accepted(reviewed, sid),
            FOLLOWS_JUDGE: self.layout.review_accepted(reviewed, sid),  # results, beside the accepted ones
            "drop": self.layout.review_dropped(reviewed, sid),
        }
        applied = self.applied
        with contextlib.ExitStack() as stack:  # a file only for an outcome that takes rows
            outs: dict[str, Any] = {}
            for pos, row in enumerate(JsonlFile(shard.uri, storage_options=self.so).iter_records()):
                outcome, written = self._row(row, sid, pos)
                uri = uris[outcome]
                if uri not in outs:
                    out = record_file(
                        uri, storage_options=self.so, id_field=self.id_field, inputs=self.inputs
                    )
                    outs[uri] = stack.enter_context(out.writer_sync())
                outs[uri].write(written)
                digests[outcome].add(row.get(self.id_field))
                applied.counts[outcome] = applied.counts.get(outcome, 0) + 1
        self.made.update(outs)
        applied.accepted += digests["accept"]
        applied.dropped += digests["drop"]
        applied.approved += digests[FOLLOWS_JUDGE]
        if digests["retry"].count:
            retry = digests["retry"]
            applied.shards.append(ShardRef(shard_id=sid, uri=uris["retry"], records=retry.count, ids=retry))

    def _row(self, row: dict[str, Any], sid: str, pos: int) -> tuple[Outcome, dict[str, Any]]:
        """A pending row's outcome, and the row as its outcome's file holds it."""
        sample = self.view.to_sample(row, sid, pos, prompt=self.resolver.needs_prompts)
        decision = self.resolver.decision(sample)
        if decision is None:
            outcome = undecided(sample.spot_check)
            if outcome == FOLLOWS_JUDGE and (name := counted(row.get(ADAPTER_FIELD))) is not None:
                by_adapter = self.applied.approved_by_adapter
                by_adapter[name] = by_adapter.get(name, 0) + 1
            return outcome, (row if outcome == "retry" else _approved(row))
        judged = judge_verdict(sample)
        pair = pair_of(sample, decision, tenths=self.tenths)
        if pair is not None:
            self.pairs.append(pair)
        elif judged is None:
            self.unjudged += 1
        else:
            self.bulk += 1
        return decision.action, _marked(row, decision, None if judged is None else judged[0])

    def finish(self, last: Summary | None) -> None:
        """Remove what an earlier application of these decisions wrote that they no longer make;
        store the calibration (``last``: the reviewed round's summary) and the split's manifest."""
        prefix = f"reviewed-r{self.reviewed:02d}-"
        made, retained = self.made, self.retained_dir.uri
        files.remove_others(self.layout.results, prefix, made, self.so)
        files.remove_others(self.layout.dropped, prefix, made, self.so)
        files.remove_others(retained, "", made | {join(retained, "_manifest.json")}, self.so)
        decisions = self.applied.decisions
        if judge_checked(self.cfg.judging.judge):
            doc = calibrate(self.pairs, last.verdicts if last is not None else None, round=self.reviewed)
            doc = doc.model_copy(
                update={"decisions": decisions, "bulk": self.bulk, "unjudged": self.unjudged}
            )
            write_calibration(self.layout, doc, self.so)
        write_manifest(
            self.retained_dir,
            OutputManifest(
                kind="review",
                state="complete",
                round=self.r,
                reviewed_round=self.reviewed,
                decisions=decisions,
                shards=[*self.applied.shards],
                records=self.applied.counts["retry"],
                applied=self.applied.doc().to_json(),
            ),
        )


def _person(row: dict[str, Any], decision: Decision, judge: bool | None) -> dict[str, Any]:
    """``row``'s judgment with the person's verdict: ``person`` and, where the judge gave one,
    ``overridden`` (the person's verdict is not the judge's)."""
    judgment = dict(row.get("judgment") or {})
    person: dict[str, Any] = {
        "approved": decision.action == "accept",
        "action": decision.action,
        "by": decision.by,
        "at": decision.at,
        "note": decision.note,
    }
    if decision.bulk:
        person["bulk"] = True
    judgment["person"] = person
    if judge is not None:
        judgment["overridden"] = person["approved"] != judge
    return judgment


def _marked(row: dict[str, Any], decision: Decision, judge: bool | None) -> dict[str, Any]:
    """A decided row: the person's verdict in its judgment (``judgment.person``: the action, who,
    when, the note); an accepted one is also marked ``accepted_by_review``. A retried row carries
    ``sent_back`` (who, when, the note, the round reviewed), which its next attempt's prompt may read
    (``previous.note``: :func:`~airflow_batchinfer.prompts.retries.previous_of`) and which that attempt's
    row no longer carries (a field of the generation it replaces, as its judgment is). The record's
    own fields are left as they are."""
    marked = {**row, "judgment": _person(row, decision, judge)}
    if decision.action == "retry":
        return {**marked, SENT_BACK: decision.sent_back()}
    return {**marked, "accepted_by_review": True} if decision.action == "accept" else marked


def _approved(row: dict[str, Any]) -> dict[str, Any]:
    """An undecided spot check, into results as the judge said: approved (still marked a spot check)."""
    return {**row, "status": "approved", "judgment": {**(row.get("judgment") or {}), "approved": True}}
