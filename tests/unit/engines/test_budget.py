"""Token budgets with a reasoning model's thinking (issue 39, item 1): the thinking counts inside
max_tokens, so the batcher's estimate has no term for it; the answer's room, the pre-flight's warning
and ``batchinfer plan``'s ``--thinking-tokens``."""

from __future__ import annotations

import json

import pytest

from airflow_batchinfer.cli import main
from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.budget import answer_room, record_tokens, thinking_warnings


def test_the_answers_room_is_what_a_whole_thinking_budget_leaves() -> None:
    assert answer_room(512, None) is None  # no budget: the thinking is bounded by max_tokens only
    assert (answer_room(512, 384), answer_room(512, 512), answer_room(512, 900)) == (128, 0, 0)
    assert record_tokens(400, 0) == 400 and record_tokens(400, 1024) == 1424


def test_the_batchers_estimate_counts_the_thinking_once_inside_max_tokens() -> None:
    request = GenerationRequest(
        "a", prompt="x" * 40, sampling=SamplingParams(max_tokens=256, n=2, temperature=0.7)
    )
    assert request.estimate_tokens() == 11 + 2 * 256  # whatever thinking budget the request has


def test_a_thinking_budget_that_leaves_no_room_for_the_answer_is_warned_of() -> None:
    assert thinking_warnings({"thinking_token_budget": 384}, 512) == []
    assert thinking_warnings({}, 512) == []
    (warning,) = thinking_warnings({"thinking_token_budget": 512}, 512, "retry_sampling.2")
    assert warning.startswith(
        "retry_sampling.2.thinking_token_budget 512 leaves no room for the answer within max_tokens 512"
    )
    assert "truncated_in_thinking" in warning and "Remedy: max_tokens above the thinking budget" in warning


def test_plan_adds_the_thinking_tokens_to_what_a_record_costs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--records", "1000", "--gpus", "1", "--tokens-per-s", "1000", "--json"]
    assert main([*args, "--tokens-per-record", "400"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--tokens-per-record", "400", "--thinking-tokens", "1200"]) == 0
    thinking = json.loads(capsys.readouterr().out)
    assert (plain["tokens_per_record"], thinking["tokens_per_record"]) == (400, 1600)
    assert main([*args, "--thinking-tokens", "-1"]) != 0
    assert "--thinking-tokens must be >= 0" in capsys.readouterr().err
