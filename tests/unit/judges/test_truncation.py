"""Truncation is a reason, not a result (issue 25, item 4): the pure decision after an attempt, the
policy's settings and job params, and the simulated engine's deterministic truncation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_batchinfer.engines import GenerationRequest, SamplingParams, create_engine
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.reasons import ReasonGroups, reason_group
from airflow_batchinfer.judges.truncation import (
    TruncationPolicy,
    decide,
    row_decision,
)
from airflow_batchinfer.state.params import JobParams, parse_params

POLICY = TruncationPolicy()


def test_a_completion_that_stopped_is_no_truncation_and_keeps_its_budget() -> None:
    for finish in ("stop", "error", None):
        d = decide(finish, 2, 64, POLICY)
        assert (d.truncated, d.reject, d.max_tokens, d.reason) == (False, False, 64, None)


def test_a_truncated_attempt_is_rejected_and_its_retry_runs_with_twice_the_tokens() -> None:
    d = decide("length", 1, 16, POLICY)
    assert d.truncated and d.reject and d.max_tokens == 32 and not d.at_cap
    assert d.reason == (
        "truncated: attempt 1 stopped at max_tokens 16 (finish_reason length); "
        "a retry runs with max_tokens 32"
    )
    assert reason_group(d.reason) == "truncated"
    # the factor rounds up, and a factor of 1 raises nothing (and says so)
    assert decide("length", 1, 5, TruncationPolicy(max_tokens_factor=1.5)).max_tokens == 8
    same = decide("length", 3, 16, TruncationPolicy(max_tokens_factor=1))
    assert same.max_tokens == 16 and "runs with 16 again (truncated_max_tokens_factor 1 raises none)" in (
        same.reason or ""
    )


def test_the_deployments_cap_bounds_the_raise_and_the_reason_says_so() -> None:
    capped = TruncationPolicy(max_tokens_cap=48)
    d = decide("length", 2, 32, capped)
    assert d.max_tokens == 48 and d.at_cap
    assert (d.reason or "").endswith("a retry runs with max_tokens 48, the deployment's cap (max_max_tokens)")
    at = decide("length", 3, 48, capped)  # already at the cap: no more tokens, and the remedy
    assert at.max_tokens == 48 and at.at_cap and at.reject
    assert at.reason == (
        "truncated: attempt 3 stopped at max_tokens 48 (finish_reason length), at the deployment's cap "
        "(max_max_tokens 48): a retry gets no more tokens; remedy: shorten the answers the prompt asks "
        "for, or ask for a higher max_max_tokens"
    )
    # never above the cap, even from a budget that was (an OpenAI batch body's own max_tokens)
    assert decide("length", 1, 100, capped).max_tokens == 48
    assert decide("length", 1, 40, TruncationPolicy(max_tokens_cap=1000)).max_tokens == 80


def test_judge_mode_lets_the_judge_decide_but_still_raises_the_retry() -> None:
    d = decide("length", 1, 16, TruncationPolicy(mode="judge"))
    assert d.truncated and not d.reject and d.max_tokens == 32


def test_a_row_carries_what_the_decision_reads() -> None:
    row = {"id": "a", "finish_reason": "length", "attempts": 2, "max_tokens": 20}
    assert row_decision(row, POLICY).max_tokens == 40
    assert "attempt 2 stopped at max_tokens 20" in (row_decision(row, POLICY).reason or "")
    # a row written before rows carried max_tokens: rejected all the same, retried with the job's own
    old = row_decision({"finish_reason": "length", "attempts": 1}, POLICY)
    assert old.reject and old.max_tokens is None and reason_group(old.reason or "") == "truncated"
    # a raised budget is kept by a row that did not truncate
    assert row_decision({**row, "finish_reason": "stop"}, POLICY).max_tokens == 20


def test_the_reason_group_is_one_whatever_the_numbers() -> None:
    groups = ReasonGroups()
    for budget in (16, 32, 48):
        groups.add(decide("length", 1, budget, TruncationPolicy(max_tokens_cap=48)).reason)
    assert groups.as_dict() == {"truncated": 3}


def test_the_policy_refuses_bad_values_naming_the_param() -> None:
    with pytest.raises(ConfigError, match=r"params\.truncated 'maybe': choose one of reject, judge"):
        TruncationPolicy.from_params({"truncated": "maybe"})
    with pytest.raises(ConfigError, match=r"params\.truncated_max_tokens_factor must be a number in \[1,"):
        parse_params("infer", {"prompt_template": "x", "truncated_max_tokens_factor": 0.5})
    with pytest.raises(ConfigError, match=r"params\.max_tokens_cap must be a whole number >= 1"):
        parse_params("judge", {"judge": {"type": "length"}, "max_tokens_cap": "big"})


def test_job_params_name_only_what_differs_from_the_defaults() -> None:
    """So a job at the defaults keeps the id and fingerprint it had before these settings."""
    assert JobParams(truncated="reject", truncated_max_tokens_factor=2.0, max_tokens_cap=None).wire() == {}
    wire = JobParams(truncated="judge", truncated_max_tokens_factor=3, max_tokens_cap=512).wire()
    assert wire == {"truncated": "judge", "truncated_max_tokens_factor": 3, "max_tokens_cap": 512}
    p = TruncationPolicy("judge", 3, 512)
    assert TruncationPolicy.from_params(wire) == p
    job = parse_params("in_place", {"prompt_template": "x", "judge": {"type": "llm"}, **wire})
    assert job.truncation == p


# ------------------------------------------------------------------------- the simulated engine
def _generate(prompt: str, max_tokens: int, **engine: Any) -> Any:
    e = create_engine("simulated", latency_base_s=0.0, **engine)
    req = GenerationRequest("a", prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens))
    return asyncio.run(e.generate([req]))[0]


def test_the_simulated_engine_truncates_below_the_length_a_prompt_asks_for() -> None:
    cut = _generate("q simulate_tokens=40", 16)
    assert (cut.finish_reason, cut.completion_tokens) == ("length", 16) and cut.ok
    whole = _generate("q simulate_tokens=40", 40)
    assert (whole.finish_reason, whole.completion_tokens) == ("stop", 40)
    assert whole.text == cut.text  # deterministic: the same answer, whatever the budget
    # a prompt that asks for nothing is as before: completion_tokens, never truncated
    assert _generate("q", 4).finish_reason == "stop"
