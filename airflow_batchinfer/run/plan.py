"""What a round slot does. :func:`load_snapshot` reads what the decision needs (the plans before the
slot, the round's pending set, the summary of the round before) into a :class:`RoundSnapshot`;
:func:`propose` decides from it, with no I/O; :func:`propose_slot` does both.

A review gate's answer is checked (:func:`check_answer`, no I/O), then takes effect in storage: the
reviewers' decisions on the previous round's rejected rows are applied
(:func:`airflow_batchinfer.review.apply.apply_decisions`: the review package owns them and reads only
:mod:`~airflow_batchinfer.state.docs` of this package, so there is no cycle) and *Accept remaining*
copies the rows it accepts; :func:`decide_answer` (no I/O) then makes the slot's plan.
:func:`apply_choice` does the three.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.exceptions import ConfigError, ReviewError
from airflow_batchinfer.judges import judges_in_place
from airflow_batchinfer.judges.spot_check import round_rate
from airflow_batchinfer.review.apply import Applied, apply_decisions
from airflow_batchinfer.run.gate.changes import changed_settings, gate_refusals
from airflow_batchinfer.spec.limits import TriggerLimits
from airflow_batchinfer.state.config import RunConfig, round_config
from airflow_batchinfer.state.docs import (
    TAIL,
    Digest,
    Plan,
    Summary,
    read_plan,
    read_summary,
    review_split,
    slots,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard, planned
from airflow_batchinfer.storage import JsonlDir, JsonlFile, files
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.manifest import read_manifest
from airflow_batchinfer.storage.parquet_columns import pinned
from airflow_batchinfer.storage.record_file import is_parquet, record_file
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef

# Review gate options (the Required Actions page shows them as buttons).
CONTINUE = "Continue"
CONTINUE_IN_PLACE = "Continue in place"
ACCEPT = "Accept remaining as they are"
STOP = "Stop"
ANSWERS = (CONTINUE, CONTINUE_IN_PLACE, ACCEPT, STOP)

# Why a run stopped; the first is a normal completion, the rest are reported as what they are.
NOTHING_PENDING = "nothing pending"
MAX_ROUNDS = "max_rounds reached"
STOPPED_BY_REVIEW = "stopped by review"
ACCEPTED_BY_REVIEW = "remaining accepted by review"
IN_PLACE_DONE = "in-place retry finished"


@dataclass(frozen=True)
class RoundSnapshot:
    """What :func:`propose` decides a slot from, as storage held it.

    ``prior``: the plans of the slots before ``slot`` that planned, in slot order (of an unused slot
    past ``max_rounds``: of every round slot). ``pending``: the round's pending set as reviewers'
    decisions left it, ``None`` when not read (the plans already stopped the run or retried in
    place). ``last``: the summary of the round before, when anything is pending."""

    slot: str
    prior: tuple[Plan, ...] = ()
    pending: tuple[ShardRef | RangeRef, ...] | None = None
    last: Summary | None = None

    @property
    def round(self) -> int:
        """The slot's round number: how many slots before it ran a round."""
        return sum(1 for p in self.prior if p.mode == "rounds")


@dataclass
class Proposal:
    """The controller's decision before review; ``options`` is non-empty when a person must confirm."""

    plan: Plan
    options: list[str] = field(default_factory=list)
    last: Summary | None = None  # the previous round's summary (what the review shows)


def pending_shards(
    layout: RunLayout, r: int, so: StorageOptions | None = None, *, reviewed: bool = True
) -> list[ShardRef | RangeRef]:
    """Round ``r``'s input: the sharded dataset, or what round ``r - 1`` recompacted; once a
    review's decisions took effect (``reviewed``), what they left pending."""
    split = review_split(layout, r, so) if reviewed else None
    if split is not None:
        return [s for s in split.shards if s.records]
    manifest = read_manifest(JsonlDir(layout.pending(r), storage_options=so))
    if manifest is None or not manifest.complete:
        raise ConfigError(f"{layout.pending(r)} is not complete: its writer (shard or close) did not finish")
    return [s for s in manifest.shards if s.records]


def _unused(cfg: RunConfig, slot: str) -> bool:
    """A slot of a DAG built with more round slots than this run's ``max_rounds``: it has no round."""
    return bool(re.fullmatch(r"round-\d{2}", slot)) and int(slot[6:]) >= cfg.retries.max_rounds


def slots_before(cfg: RunConfig, slot: str) -> list[str]:
    """The slots whose plans decide ``slot`` (:attr:`RoundSnapshot.prior`)."""
    all_slots = slots(cfg.retries.max_rounds)
    if slot in all_slots:
        return all_slots[: all_slots.index(slot)]
    return all_slots[:-1] if _unused(cfg, slot) else []


def load_snapshot(cfg: RunConfig, slot: str, so: StorageOptions | None = None) -> RoundSnapshot:
    """Read what :func:`propose` needs to decide ``slot`` (no more: nothing past the plans once they
    stopped the run or retried in place, no summary when nothing is pending)."""
    layout = RunLayout(cfg.run_root)
    all_slots = slots(cfg.retries.max_rounds)
    before = slots_before(cfg, slot)
    snapshot = RoundSnapshot(slot, tuple(p for s in before if (p := read_plan(layout, s, so))))
    if slot not in all_slots or any(p.stop or p.mode == "in_place" for p in snapshot.prior):
        return snapshot  # decided from the plans alone
    r = snapshot.round
    pending = tuple(pending_shards(layout, r, so))
    last = read_summary(layout, r - 1, so) if pending and r else None
    return dataclasses.replace(snapshot, pending=pending, last=last)


def propose_slot(cfg: RunConfig, slot: str, so: StorageOptions | None = None) -> Proposal:
    """What ``slot`` does, from storage as it is now: :func:`propose` over :func:`load_snapshot`."""
    return propose(cfg, load_snapshot(cfg, slot, so))


def propose(cfg: RunConfig, snapshot: RoundSnapshot) -> Proposal:
    """Decide what ``snapshot.slot`` does from the plans and the summary before it (no I/O)."""
    proposal = _propose(cfg, snapshot)
    spot_checked(cfg, proposal.plan)
    return proposal


def spot_checked(cfg: RunConfig, plan: Plan) -> Plan:
    """``plan`` with its shards' ``spot_check_rate`` when the run spot-checks approved rows and the
    plan runs a round: the rate that holds back about ``spot_check_approved`` of the rows it plans
    (:func:`~airflow_batchinfer.judges.spot_check.round_rate`); each judge job samples at it."""
    if plan.mode != "rounds" or not cfg.reviews.spot_check_approved:
        return plan
    rate = round_rate(cfg.reviews.spot_check_approved, plan.records)
    plan.shards = [s.with_spot_check(rate) for s in plan.shards]
    return plan


def _propose(cfg: RunConfig, snapshot: RoundSnapshot) -> Proposal:
    slot, prior, r = snapshot.slot, snapshot.prior, snapshot.round
    all_slots = slots(cfg.retries.max_rounds)
    if slot not in all_slots:
        if _unused(cfg, slot):
            reason = f"max_rounds is {cfg.retries.max_rounds}: this slot is not used"
            return Proposal(Plan(slot=slot, round=r, mode="skip", reason=reason))
        raise ConfigError(f"round slot {slot!r} is not one of {all_slots}")
    stopped = next((p for p in prior if p.stop), None)
    if stopped is not None:
        return Proposal(
            Plan(slot=slot, round=r, mode="skip", reason=f"the run stopped at {stopped.slot}: {stopped.stop}")
        )
    if any(p.mode == "in_place" for p in prior):
        return Proposal(Plan(slot=slot, round=r, mode="skip", reason="in-place retry already ran"))
    if snapshot.pending is None:
        raise ConfigError(f"{slot}: the snapshot holds no pending set of round {r} (see load_snapshot)")
    pending = planned(snapshot.pending)
    if not pending:
        return Proposal(Plan(slot=slot, round=r, mode="skip", reason="nothing pending", stop=NOTHING_PENDING))
    last = snapshot.last
    switched = cfg.retries.strategy == "in_place" or any(p.switch_in_place for p in prior)
    if slot == TAIL:
        if switched or cfg.retries.strategy == "hybrid":
            plan = Plan(
                slot=slot, round=r, mode="in_place", shards=pending, reason="retry what rounds left, in place"
            )
        else:
            plan = Plan(
                slot=slot, round=r, mode="skip", shards=pending, reason=f"{r} rounds ran", stop=MAX_ROUNDS
            )
        options = [CONTINUE_IN_PLACE, ACCEPT, STOP]
    else:
        options = [CONTINUE, CONTINUE_IN_PLACE, ACCEPT, STOP]
        shrink = _approval(last)
        if switched:
            plan = Plan(
                slot=slot, round=r, mode="skip", reason="in place from here: the tail slot retries the rest"
            )
        elif (
            cfg.retries.strategy == "hybrid" and shrink is not None and shrink < cfg.retries.hybrid_min_shrink
        ):
            plan = Plan(
                slot=slot,
                round=r,
                mode="skip",
                reason=f"round {r - 1} approved {shrink:.0%} of its pending set "
                f"(< {cfg.retries.hybrid_min_shrink:.0%}): switching to in place",
                switch_in_place=True,
            )
        else:
            plan = Plan(
                slot=slot,
                round=r,
                mode="rounds",
                shards=pending,
                reason=f"round {r} on {len(pending)} pending shards",
            )
    plan.settings = next((p.settings for p in reversed(prior) if p.settings), None)
    plan.config = round_config(cfg, plan.settings)  # once: every task of the round reads it here
    if r == 0 or (switched and plan.mode == "skip" and plan.stop is None):
        return Proposal(plan, last=last)  # nothing to review yet / the decision was already made
    approval = _approval(last)
    if any(p.review and p.round == r for p in prior):
        return Proposal(plan, last=last)  # this round's gate was answered already (Continue in place)
    if not judges_in_place(cfg.judging.judge.get("type")):
        options = [o for o in options if o != CONTINUE_IN_PLACE]  # no person answers inside a job
    review = (
        cfg.reviews.review == "every_round"
        or (
            cfg.reviews.review == "on_low_approval"
            and approval is not None
            and approval < cfg.reviews.review_min_approval
        )
        # people judge: after a human-judged round, or one whose low-scored verdicts or spot checks
        # await them (a round whose spot check held none still opens: people check the judge)
        or cfg.judging.judge.get("type") == "human"
        or bool(cfg.reviews.spot_check_approved)
        or bool(last is not None and last.for_review)
    )
    return Proposal(plan, options if review else [], last)


def _approval(summary: Summary | None) -> float | None:
    """The share of a round's pending rows its judge approved: the spot checks held back for people
    are approvals too (undecided, they follow the judge into results), so checking the judge never
    makes a hybrid run switch to in place sooner."""
    if summary is None or not summary.pending:
        return None
    return float(summary.approved + (summary.spot_checks or 0)) / float(summary.pending)


@dataclass(frozen=True)
class Answer:
    """A review gate's answer, checked (:func:`check_answer`): what the plan records of it
    (``review``) and the settings the round runs with from here (``settings``)."""

    choice: str
    by: str
    review: dict[str, Any]
    settings: dict[str, Any] | None
    config: RunConfig | None = None  # the settings the round runs (Plan.config)


def check_answer(
    cfg: RunConfig,
    plan: Plan,
    choice: str,
    *,
    by: str = "review",
    changes: dict[str, Any] | None = None,
    limits: TriggerLimits | None = None,
) -> Answer:
    """``choice`` for the proposed ``plan``, with the settings ``changes``
    (:data:`~airflow_batchinfer.run.gate.changes.GATE_CHANGES`), checked before anything of it takes effect
    (no I/O): an answer whose changes go over a cap of ``limits`` is refused
    (:class:`~airflow_batchinfer.exceptions.ReviewError`)."""
    review: dict[str, Any] = {
        "choice": choice,
        "by": by,
        "proposed": plan.mode,
        "proposed_reason": plan.reason,
    }
    settings = changed_settings(plan.settings, changes or {})
    config = plan.effective_config(cfg)
    if settings != plan.settings:
        review["changes"] = {k: v for k, v in (changes or {}).items() if v is not None}
        config = round_config(cfg, settings)
        if limits is not None and (over := gate_refusals(config, settings or {}, limits)):
            raise ReviewError(
                f"{plan.slot}: the answer of {by} is refused, nothing of it was applied: {'; '.join(over)}. "
                "Remedy: clear this plan task (with its downstream tasks) to open its review again, and "
                "answer within the caps"
            )
    if choice not in ANSWERS:
        raise ConfigError(f"review answer {choice!r} is not one of {list(ANSWERS)}")
    return Answer(choice, by, review, settings, config)


def every_row_decided(answer: Answer, pending: list[PlannedShard], applied: Applied | None) -> bool:
    """Whether the reviewers' decisions left nothing pending to act on (the answer is not Stop)."""
    return applied is not None and not pending and answer.choice != STOP


def decide_answer(
    plan: Plan,
    answer: Answer,
    *,
    pending: list[PlannedShard],
    applied: Applied | None,
    accepted: IdDigest | None = None,
) -> Plan:
    """The slot's plan for ``answer`` to the proposed ``plan`` (no I/O): ``pending`` is what the
    reviewers' decisions (``applied``; ``None``: there were none) left of the round's pending set,
    ``accepted`` the ids *Accept remaining* copied into results (:func:`accept_pending`)."""
    by, review = answer.by, answer.review
    if applied is not None and every_row_decided(answer, pending, applied):
        reason = f"{by} decided every pending row ({applied.counts})"
        chosen = Plan(
            slot=plan.slot, round=plan.round, mode="skip", reason=reason, stop=NOTHING_PENDING, review=review
        )
    else:
        chosen = _chosen(plan, answer, pending, accepted)
    chosen.settings, chosen.config = answer.settings, answer.config
    chosen.reviewed = applied.doc() if applied is not None else None
    return chosen if answer.config is None else spot_checked(answer.config, chosen)


def _chosen(plan: Plan, answer: Answer, pending: list[PlannedShard], accepted: IdDigest | None) -> Plan:
    choice, by, review = answer.choice, answer.by, answer.review
    if choice == CONTINUE:
        return Plan(
            slot=plan.slot,
            round=plan.round,
            mode="rounds",
            shards=pending,
            reason=f"{by} chose another round",
            review=review,
        )
    if choice == CONTINUE_IN_PLACE:
        if plan.slot == TAIL:
            return Plan(
                slot=plan.slot,
                round=plan.round,
                mode="in_place",
                shards=pending,
                reason=f"{by} chose in place",
                review=review,
            )
        reason = f"{by} chose in place: the tail slot retries the rest"
        return Plan(
            slot=plan.slot, round=plan.round, mode="skip", reason=reason, switch_in_place=True, review=review
        )
    if choice == ACCEPT:
        if accepted is None:
            raise ConfigError(f"{plan.slot}: Accept needs the ids accept_pending copied (accepted=)")
        return Plan(
            slot=plan.slot,
            round=plan.round,
            mode="skip",
            reason=f"{by} accepted {accepted.count} remaining rows as they are",
            stop=ACCEPTED_BY_REVIEW,
            review=review,
            accepted=Digest.of(accepted),
        )
    if choice == STOP:
        return Plan(
            slot=plan.slot,
            round=plan.round,
            mode="skip",
            reason=f"{by} stopped the run",
            stop=STOPPED_BY_REVIEW,
            review=review,
        )
    raise ConfigError(f"review answer {choice!r} is not one of {list(ANSWERS)}")


def apply_choice(
    cfg: RunConfig,
    proposal: Proposal,
    choice: str,
    *,
    by: str = "review",
    so: StorageOptions | None = None,
    changes: dict[str, Any] | None = None,
    limits: TriggerLimits | None = None,
) -> Plan:
    """Turn a review answer into the slot's plan: :func:`check_answer` (a refused answer changes
    nothing), the reviewers' decisions applied, the rows *Accept remaining* accepts copied into
    results, then :func:`decide_answer`. ``changes``
    (:data:`~airflow_batchinfer.run.gate.changes.GATE_CHANGES`) hold for this round and the next ones;
    ``limits``: the limits in force for the run."""
    plan = proposal.plan
    answer = check_answer(cfg, plan, choice, by=by, changes=changes, limits=limits)
    layout = RunLayout.of(cfg.run_root, cfg.data.output_format)  # rows it accepts: in the run's format
    # The reviewers' decisions on the rejected rows take effect whatever the answer; the rest (retry)
    # is what the answer acts on.
    applied = apply_decisions(cfg, plan.round, pending_shards(layout, plan.round, so, reviewed=False), so)
    pending = planned(
        applied.shards if applied is not None else plan.shards or pending_shards(layout, plan.round, so)
    )
    accepted = None
    if choice == ACCEPT and not every_row_decided(answer, pending, applied):
        accepted = accept_pending(layout, plan.round, pending, so, id_field=cfg.data.id_field or "id")
    else:  # a retried gate task: an earlier "Accept remaining" is undone
        _remove_accepted(layout, plan.round, set(), so)
    return decide_answer(plan, answer, pending=pending, applied=applied, accepted=accepted)


def accept_pending(
    layout: RunLayout,
    r: int,
    pending: Iterable[PlannedShard],
    so: StorageOptions | None = None,
    *,
    id_field: str = "id",
) -> IdDigest:
    """Copy round ``r``'s pending rows into ``results/accepted-rNN-…``, marked as accepted by review.
    Returns the count and digest of the ids copied (the plan records them for the report)."""
    accepted = IdDigest()
    pending = list(pending)
    _remove_accepted(
        layout, r, {f"accepted-r{r:02d}-{shard.shard_id}{layout.suffix}" for shard in pending}, so
    )
    inputs = pinned(layout.output_columns, so) if is_parquet(layout.suffix) else ()
    for shard in pending:
        dst = join(layout.results, f"accepted-r{r:02d}-{shard.shard_id}{layout.suffix}")
        ids: list[Any] = []
        with record_file(dst, storage_options=so, id_field=id_field, inputs=inputs).writer_sync() as out:
            for row in JsonlFile(shard.uri, storage_options=so).iter_records():
                out.write({**row, "accepted_by_review": True})
                ids.append(row.get(id_field))
        accepted.add_many(ids)
    return accepted


def _remove_accepted(layout: RunLayout, r: int, keep: set[str], so: StorageOptions | None) -> None:
    """Rows an earlier answer to round ``r``'s gate accepted as they were, that this answer does not."""
    files.remove_others(layout.results, f"accepted-r{r:02d}-", {join(layout.results, n) for n in keep}, so)
