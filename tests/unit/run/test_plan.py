"""The round controller's decisions as pure functions of a snapshot: :func:`propose` over an in-memory
:class:`RoundSnapshot`, and a review answer's :func:`check_answer` / :func:`decide_answer`. No storage:
every plan, summary and pending set is built here."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError, ReviewError
from airflow_batchinfer.review.apply import Applied
from airflow_batchinfer.run.plan import (
    ACCEPT,
    ACCEPTED_BY_REVIEW,
    CONTINUE,
    CONTINUE_IN_PLACE,
    MAX_ROUNDS,
    NOTHING_PENDING,
    STOP,
    STOPPED_BY_REVIEW,
    RoundSnapshot,
    check_answer,
    decide_answer,
    propose,
)
from airflow_batchinfer.spec.limits import TriggerLimits
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Invariant, Plan, Summary
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.shard_ref import ShardRef

ALL = [CONTINUE, CONTINUE_IN_PLACE, ACCEPT, STOP]
TAIL_OPTIONS = [CONTINUE_IN_PLACE, ACCEPT, STOP]


def config(**settings: Any) -> RunConfig:
    settings.setdefault("judge", {"type": "length", "min_chars": 1})
    return RunConfig.of(input="/nowhere/in.jsonl", run_root="/nowhere/run", prompt_template="{{ q }}",
                        **settings)  # fmt: skip


def pending(n: int = 2, records: int = 10) -> tuple[ShardRef, ...]:
    return tuple(
        ShardRef(shard_id=f"part-{i:05d}", uri=f"/nowhere/part-{i:05d}.jsonl.zst", records=records)
        for i in range(n)
    )


def summary(r: int, *, pending: int = 20, approved: int = 10, for_review: int = 0) -> Summary:
    return Summary(
        round=r,
        slot=f"round-{r:02d}",
        mode="rounds",
        pending=pending,
        shards=2,
        approved=approved,
        failed_shards=[],
        failed_records=0,
        tokens={},
        job_seconds=1.0,
        rejected=pending - approved,
        inference_errors=0,
        for_review=for_review,
        next_pending=pending - approved,
        approval_rate=round(approved / pending, 4),
        invariant=Invariant(planned=pending, accounted=pending, ok=True),
    )


def ran(*rounds: int) -> tuple[Plan, ...]:
    """The plans of round slots that ran a round each."""
    return tuple(
        Plan(slot=f"round-{r:02d}", round=r, mode="rounds", shards=list(pending()), reason="ran")
        for r in rounds
    )


def after(r: int, slot: str | None = None, **last: Any) -> RoundSnapshot:
    """The snapshot of the slot after ``r`` rounds ran, the last one's summary with ``last``."""
    last_summary = summary(r - 1, **last) if r else None
    return RoundSnapshot(slot or f"round-{r:02d}", ran(*range(r)), pending(), last_summary)


def test_round_zero_runs_the_input_without_a_gate() -> None:
    proposal = propose(config(review="every_round"), RoundSnapshot("round-00", (), pending(3)))
    plan = proposal.plan
    assert (plan.mode, plan.round, plan.records, plan.stop) == ("rounds", 0, 30, None)
    assert proposal.options == [] and proposal.last is None  # nothing to review before round 0


def test_a_round_continues_on_what_the_last_left() -> None:
    proposal = propose(config(), after(1, approved=15))
    assert proposal.plan.mode == "rounds" and proposal.plan.round == 1 and proposal.plan.records == 20
    assert proposal.options == [] and proposal.last is not None and proposal.last.approved == 15


def test_nothing_pending_stops_the_run() -> None:
    plan = propose(config(), RoundSnapshot("round-01", ran(0), (), summary(0))).plan
    assert plan.mode == "skip" and plan.stop == NOTHING_PENDING and plan.shards == []


def test_slots_after_a_stop_or_an_in_place_round_skip_without_a_pending_set() -> None:
    stopped = Plan(slot="round-01", round=1, mode="skip", reason="people said so", stop=STOPPED_BY_REVIEW)
    plan = propose(config(), RoundSnapshot("round-02", (*ran(0), stopped))).plan
    assert plan.mode == "skip" and plan.stop is None and "stopped at round-01" in plan.reason
    in_place = Plan(slot="tail", round=1, mode="in_place", shards=list(pending()))
    plan = propose(config(max_rounds=1), RoundSnapshot("round-00", (in_place,))).plan
    assert plan.mode == "skip" and plan.reason == "in-place retry already ran"


def test_a_snapshot_without_the_pending_set_it_needs_is_refused() -> None:
    with pytest.raises(ConfigError, match="no pending set of round 1"):
        propose(config(), RoundSnapshot("round-01", ran(0)))


def test_the_tail_stops_at_max_rounds_and_keeps_the_pending_set() -> None:
    cfg = config(max_rounds=2, review="every_round")
    proposal = propose(cfg, after(2, "tail"))
    plan = proposal.plan
    assert (plan.mode, plan.round, plan.stop, plan.records) == ("skip", 2, MAX_ROUNDS, 20)
    assert proposal.options == TAIL_OPTIONS  # no "another round" after the last one


def test_the_tail_retries_in_place_for_hybrid_runs() -> None:
    plan = propose(config(max_rounds=2, strategy="hybrid"), after(2, "tail")).plan
    assert plan.mode == "in_place" and plan.round == 2 and plan.records == 20 and plan.stop is None


def test_unused_and_unknown_slots() -> None:
    cfg = config(max_rounds=2)
    plan = propose(cfg, RoundSnapshot("round-05", ran(0, 1))).plan
    assert plan.mode == "skip" and plan.round == 2 and "max_rounds is 2" in plan.reason
    with pytest.raises(ConfigError, match="not one of"):
        propose(cfg, RoundSnapshot("final"))


@pytest.mark.parametrize(
    ("review", "min_approval", "approved", "gate"),
    [
        ("never", 0.5, 2, False),
        ("every_round", 0.5, 19, True),
        ("on_low_approval", 0.5, 12, False),  # 60% approved
        ("on_low_approval", 0.9, 12, True),
    ],
)
def test_review_modes_decide_when_a_gate_opens(
    review: str, min_approval: float, approved: int, gate: bool
) -> None:
    proposal = propose(config(review=review, review_min_approval=min_approval), after(1, approved=approved))
    assert proposal.options == (ALL if gate else [])
    assert proposal.plan.mode == "rounds"  # the gate confirms the proposal; it does not change it


def test_a_gate_answered_for_the_round_does_not_open_again() -> None:
    switched = Plan(
        slot="round-01", round=1, mode="skip", switch_in_place=True, review={"choice": CONTINUE_IN_PLACE}
    )
    proposal = propose(config(review="every_round"), RoundSnapshot("tail", (*ran(0), switched), pending()))
    assert proposal.plan.mode == "in_place" and proposal.options == []


def test_rows_awaiting_people_open_the_gate() -> None:
    assert propose(config(), after(1, for_review=3)).options == ALL


def test_hybrid_switches_to_in_place_below_min_shrink() -> None:
    cfg = config(strategy="hybrid", hybrid_min_shrink=0.3, max_rounds=3)
    plan = propose(cfg, after(1, approved=4)).plan  # 20% approved
    assert plan.mode == "skip" and plan.switch_in_place and plan.stop is None
    assert "approved 20% of its pending set (< 30%): switching to in place" in plan.reason
    assert propose(cfg, after(1, approved=8)).plan.mode == "rounds"  # 40%: rounds go on
    # the slots after the switch leave the rest to the tail, which retries it in place
    later = RoundSnapshot("round-02", (*ran(0), plan), pending(), summary(0, approved=4))
    assert propose(cfg, later).plan.reason == "in place from here: the tail slot retries the rest"
    tail = propose(cfg, RoundSnapshot("tail", later.prior, pending(), summary(0, approved=4))).plan
    assert tail.mode == "in_place" and tail.round == 1


def test_spot_checks_count_as_the_judges_approvals_for_the_switch() -> None:
    # the judge approved 12 of 20, and 8 of those are held back for people (spot_check_approved):
    # 4 approved at the close (20%) would switch; 60% does not
    cfg = config(strategy="hybrid", hybrid_min_shrink=0.3, max_rounds=3, spot_check_approved=8)
    last = summary(0, approved=4, for_review=8).model_copy(update={"spot_checks": 8})
    proposal = propose(cfg, RoundSnapshot("round-01", ran(0), pending(), last))
    assert proposal.plan.mode == "rounds" and not proposal.plan.switch_in_place
    assert proposal.options == ALL  # people check the spot checks at the gate
    without = summary(0, approved=4, for_review=8)  # held by review_below_score: not approvals
    assert propose(cfg, RoundSnapshot("round-01", ran(0), pending(), without)).plan.switch_in_place


def test_a_human_judge_always_opens_the_gate_without_in_place() -> None:
    proposal = propose(config(judge={"type": "human"}), after(1, approved=19))
    assert proposal.options == [CONTINUE, ACCEPT, STOP]


def test_review_settings_hold_for_the_next_rounds() -> None:
    changed = Plan(
        slot="round-01",
        round=1,
        mode="rounds",
        shards=list(pending()),
        settings={"temperature": 0.2},
        review={},
    )
    snapshot = RoundSnapshot("round-02", (*ran(0), changed), pending(), summary(1))
    assert propose(config(), snapshot).plan.settings == {"temperature": 0.2}


# ----------------------------------------------------------------------------------- gate answers
def proposed(slot: str = "round-01") -> Plan:
    return Plan(
        slot=slot, round=1, mode="rounds", shards=list(pending()), reason="round 1 on 2 pending shards"
    )


def decide(choice: str, slot: str = "round-01", **kwargs: Any) -> Plan:
    plan = proposed(slot)
    answer = check_answer(config(), plan, choice, by="alice")
    kwargs.setdefault("pending", list(pending()))
    kwargs.setdefault("applied", None)
    return decide_answer(plan, answer, **kwargs)


def test_answers_become_the_slots_plan() -> None:
    cont = decide(CONTINUE)
    assert cont.mode == "rounds" and cont.records == 20 and cont.reason == "alice chose another round"
    assert cont.review == {"choice": CONTINUE, "by": "alice", "proposed": "rounds",
                           "proposed_reason": "round 1 on 2 pending shards"}  # fmt: skip
    switch = decide(CONTINUE_IN_PLACE)
    assert switch.mode == "skip" and switch.switch_in_place and switch.shards == []
    in_place = decide(CONTINUE_IN_PLACE, "tail")
    assert in_place.mode == "in_place" and in_place.records == 20
    stop = decide(STOP)
    assert stop.mode == "skip" and stop.stop == STOPPED_BY_REVIEW


def test_accepting_records_the_rows_it_copied() -> None:
    accepted = IdDigest.of(f"r{i}" for i in range(20))
    plan = decide(ACCEPT, accepted=accepted)
    assert plan.stop == ACCEPTED_BY_REVIEW and "accepted 20 remaining rows" in plan.reason
    assert plan.accepted is not None and plan.accepted.digest() == accepted
    with pytest.raises(ConfigError, match="accept_pending"):
        decide(ACCEPT)  # the copy is the caller's (apply_choice): its digest must come with it


def test_decisions_that_leave_nothing_pending_end_the_run_unless_stopped() -> None:
    applied = Applied(reviewed_round=0, decisions=20, shards=[], counts={"accept": 15, "retry": 0, "drop": 5})
    for choice in (CONTINUE, CONTINUE_IN_PLACE, ACCEPT):
        plan = decide(choice, pending=[], applied=applied)
        assert plan.mode == "skip" and plan.stop == NOTHING_PENDING
        assert "alice decided every pending row" in plan.reason
        assert plan.reviewed == applied.doc()
    assert decide(STOP, pending=[], applied=applied).stop == STOPPED_BY_REVIEW


def test_answers_are_checked_before_anything_applies() -> None:
    with pytest.raises(ConfigError, match="not one of"):
        check_answer(config(), proposed(), "Maybe")
    answer = check_answer(config(), proposed(), CONTINUE, changes={"temperature": 0.1, "system": None})
    assert answer.settings == {"temperature": 0.1} and answer.review["changes"] == {"temperature": 0.1}
    plan = decide_answer(proposed(), answer, pending=list(pending()), applied=None)
    assert plan.settings == {"temperature": 0.1} and plan.mode == "rounds"
    with pytest.raises(ReviewError, match="refused"):
        check_answer(config(), proposed(), CONTINUE, changes={"max_tokens": 5000},
                     limits=TriggerLimits(max_max_tokens=100))  # fmt: skip
