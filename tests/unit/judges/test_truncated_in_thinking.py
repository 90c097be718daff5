"""A reasoning model's answer cut while it was still thinking (issue 39, item 1): its own truncation
reason and reason group, its retry's raised budgets, and its counts apart from other truncated rows."""

from __future__ import annotations

from airflow_batchinfer.judges.candidates import GENERATION_FIELDS
from airflow_batchinfer.judges.reasons import ReasonGroups, reason_group
from airflow_batchinfer.judges.truncation import TruncationPolicy, decide, row_decision, thinking_budget
from airflow_batchinfer.prompts.retries import previous_of
from airflow_batchinfer.run.report.render import truncated_cell
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.worker.jobs.infer import least_budget, output_row

POLICY = TruncationPolicy()
CUT = {"id": "a", "finish_reason": "length", "attempts": 1, "max_tokens": 64}


def test_a_row_cut_while_thinking_is_rejected_with_its_own_reason_and_both_budgets_raised() -> None:
    d = decide("length", 1, 64, POLICY, in_thinking=True, thinking_token_budget=48)
    assert (d.truncated, d.reject, d.in_thinking, d.max_tokens, d.thinking_token_budget) == (
        True,
        True,
        True,
        128,
        96,
    )
    assert d.reason == (
        "truncated_in_thinking: attempt 1 spent its whole budget thinking (max_tokens 64, "
        "thinking_token_budget 48; finish_reason length, reasoning not ended): no answer; "
        "a retry runs with max_tokens 128 and thinking_token_budget 96"
    )
    assert reason_group(d.reason) == "truncated_in_thinking"
    # without a thinking budget only max_tokens is raised, and none is imposed
    plain = decide("length", 2, 64, POLICY, in_thinking=True)
    assert (plain.max_tokens, plain.thinking_token_budget) == (128, None)
    assert "(max_tokens 64; finish_reason length" in (plain.reason or "")
    # judge mode: the judge sees it, and the retry still gets more
    assert not decide("length", 1, 64, TruncationPolicy(mode="judge"), in_thinking=True).reject


def test_the_thinking_budget_never_outgrows_max_tokens_nor_the_cap() -> None:
    capped = TruncationPolicy(max_tokens_cap=100)
    d = decide("length", 1, 64, capped, in_thinking=True, thinking_token_budget=60)
    assert (d.max_tokens, d.thinking_token_budget, d.at_cap) == (100, 100, True)
    assert (d.reason or "").endswith(
        "a retry runs with max_tokens 100 and thinking_token_budget 100, the deployment's cap "
        "(max_max_tokens)"
    )
    at = decide("length", 2, 100, capped, in_thinking=True, thinking_token_budget=100)
    assert at.max_tokens == 100 and at.thinking_token_budget == 100 and at.reject
    assert "a retry gets no more tokens; remedy: a lower reasoning_effort or thinking_token_budget" in (
        at.reason or ""
    )


def test_a_row_says_it_was_cut_in_thinking_and_the_budget_it_ran_with() -> None:
    row = {**CUT, "truncated_in_thinking": True, "thinking_token_budget": 32, "reasoning": "hmm"}
    d = row_decision(row, POLICY)
    assert d.in_thinking and (d.max_tokens, d.thinking_token_budget) == (128, 64)
    # a plain length cut stays "truncated"; a stale flag on a row that stopped is no cut at all
    assert reason_group(row_decision(CUT, POLICY).reason or "") == "truncated"
    stopped = row_decision({**row, "finish_reason": "stop"}, POLICY)
    assert not stopped.truncated and not stopped.in_thinking and stopped.thinking_token_budget is None
    # only a JSON true counts (a record's own field of that name is data)
    assert not row_decision({**CUT, "truncated_in_thinking": "yes"}, POLICY).in_thinking


def test_the_two_groups_count_apart_whatever_the_numbers() -> None:
    groups = ReasonGroups()
    for budget in (16, 32):
        groups.add(decide("length", 1, budget, POLICY).reason)
        groups.add(decide("length", 1, budget, POLICY, in_thinking=True, thinking_token_budget=8).reason)
    groups.add(decide("length", 1, None, POLICY, in_thinking=True).reason)
    assert groups.as_dict() == {"truncated_in_thinking": 3, "truncated": 2}


def test_the_tally_counts_rows_cut_in_thinking_among_the_truncated_and_apart() -> None:
    t = Tally()
    t.count_truncated(
        [
            {"finish_reason": "length", "truncated_in_thinking": True},
            {"finish_reason": "length"},
            {"finish_reason": "stop", "truncated_in_thinking": True},  # stale: not cut
        ]
    )
    assert (t.truncated, t.truncated_in_thinking) == (2, 1)
    assert (t + t).truncated_in_thinking == 2
    assert Tally.model_validate(t.model_dump()).truncated_in_thinking == 1
    assert t.by_outcome() == {"truncated": 2, "truncated_in_thinking": 1}
    assert "truncated_in_thinking" not in Tally(truncated=1).model_dump()  # 0: stored as before


def test_the_report_shows_them_inside_the_truncated_column() -> None:
    assert truncated_cell({"truncated": 3}) == "3"
    assert truncated_cell({"truncated": 3, "truncated_in_thinking": 2}) == "3 (2 in thinking)"


def test_the_next_attempt_is_told_and_gets_more_of_both() -> None:
    row = {**CUT, "truncated_in_thinking": True, "thinking_token_budget": 32, "result": ""}
    previous = previous_of(row)
    assert previous is not None and previous.truncated_in_thinking and previous.thinking_token_budget == 32
    assert previous.as_dict()["truncated_in_thinking"] is True  # the template's previous says so
    assert least_budget(previous, POLICY) == (128, 64)
    assert least_budget(previous_of(CUT), POLICY) == (128, None)
    assert least_budget(None, POLICY) == (None, None)


def test_a_retry_row_keeps_none_of_an_earlier_attempts_reasoning() -> None:
    earlier = {
        **CUT,
        "q": 1,
        "reasoning": "r",
        "reasoning_tokens": 9,
        "truncated_in_thinking": True,
        "thinking_token_budget": 32,
    }
    assert output_row(earlier, round=1, result="x") == {**CUT, "q": 1, "result": "x", "round": 1}
    assert {"reasoning", "truncated_in_thinking", "thinking_token_budget"} <= GENERATION_FIELDS


def test_the_thinking_budget_is_read_from_sampling_by_name() -> None:
    class Sampling:
        thinking_token_budget = 12

    assert thinking_budget(Sampling()) == 12 and thinking_budget(object()) is None
