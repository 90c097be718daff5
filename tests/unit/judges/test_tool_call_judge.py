"""The ``tool_call`` rule judge over an answer's calls, llm judges shown the calls, and a selected
candidate's calls on its row."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
from airflow_batchinfer.engines.tools import ToolCall
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JudgeItem, build_judge, candidates
from airflow_batchinfer.judges.base import Verdict
from airflow_batchinfer.judges.llm import LLMJudge
from airflow_batchinfer.worker.jobs.judge import _selected

PARIS = ToolCall("c1", "get_weather", '{"city": "Paris"}')
LOWER = ToolCall("c", "get_weather", '{"city": "paris"}')
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}},
    "required": ["city"],
}


def judged(spec: dict[str, Any], *calls: ToolCall) -> Verdict:
    judge = build_judge({"type": "tool_call", **spec}, callables=None)
    (verdict,) = judge.check_all([JudgeItem({}, "", "1", tool_calls=calls or None)])  # type: ignore[attr-defined]
    return verdict


@pytest.mark.parametrize(
    ("spec", "calls", "approved", "reason"),
    [
        ({"name": "get_weather"}, (PARIS,), True, "called get_weather"),
        ({"name": ["search", "get_weather"], "arguments": CITY}, (PARIS,), True, "called get_weather"),
        ({"name": "get_weather"}, (), False, "no tool call (expected get_weather)"),
        ({"name": "search"}, (PARIS,), False, "called get_weather, not search"),
        ({"name": "get_weather", "arguments": CITY}, (ToolCall("c", "get_weather", '{"town": "x"}'),), False,
         "schema: 'city' is a required property"),
        ({"name": "get_weather", "arguments": CITY}, (LOWER,), False,
         "does not match"),
        ({"name": "get_weather"}, (ToolCall("c", "get_weather", '{"city": '),), False, "are not JSON"),
        # one matching call is enough: the bad one before it does not reject the answer
        ({"name": "get_weather"}, (ToolCall("c", "get_weather", "[]"), PARIS), True, "called get_weather"),
    ],
)  # fmt: skip
def test_the_rule_approves_a_call_of_the_name_with_arguments_that_hold(
    spec: dict[str, Any], calls: tuple[ToolCall, ...], approved: bool, reason: str
) -> None:
    verdict = judged(spec, *calls)
    assert verdict.approved is approved and reason in verdict.reason, verdict


@pytest.mark.parametrize(
    ("spec", "named"),
    [({}, "bad arguments"), ({"name": []}, "name must be"), ({"name": "f", "arguments": []}, "JSON Schema"),
     ({"name": "f", "arguments": {"type": 3}}, "invalid schema")],
)  # fmt: skip
def test_a_rule_of_the_wrong_shape_is_refused(spec: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        build_judge({"type": "tool_call", **spec}, callables=None)


def test_the_rule_describes_itself() -> None:
    judge = build_judge({"type": "tool_call", "name": "f", "arguments": CITY}, callables=None)
    assert judge.describe() == {"type": "tool_call", "name": ["f"], "arguments": CITY}


async def test_an_llm_judge_sees_the_calls_and_a_row_without_calls_renders_as_before() -> None:
    seen: list[GenerationRequest] = []

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        seen.extend(requests)
        return [GenerationResult('{"approved": true, "reason": "ok", "score": 1}') for _ in requests]

    items = [
        JudgeItem({"prompt": "weather?"}, "", "1", tool_calls=(PARIS,)),
        JudgeItem({"prompt": "hi"}, "hello", "2"),
    ]
    await LLMJudge().judge(items, generate)
    called, plain = (r.messages[-1]["content"] for r in seen)  # type: ignore[index]
    assert "Tool calls the answer makes (parsed, not executed)" in called and '"arguments"' in called
    assert '"name": "get_weather"' in called and "Paris" in called
    assert "Tool calls" not in plain
    own = LLMJudge("{{ result }} {{ tool_calls[0].function.name if tool_calls else 'none' }}")
    seen.clear()
    await own.judge(items, generate)
    assert [r.messages[-1]["content"] for r in seen] == [" get_weather", "hello none"]  # type: ignore[index]


def test_the_chosen_candidate_s_calls_and_reasoning_replace_the_row_s() -> None:
    call = PARIS.as_json()
    first = {"index": 0, "result": "", "tool_calls": [call], "reasoning": "look it up", "reasoning_tokens": 3}
    row = {
        "id": 1, "result": "", "tool_calls": [call], "reasoning": "look it up", "reasoning_tokens": 3,
        "candidates": [first, {"index": 1, "result": "no", "reasoning": "no need", "reasoning_tokens": 2}],
    }  # fmt: skip
    verdicts = [Verdict(False, "x"), Verdict(True, "y")]
    out = _selected(row, verdicts, candidates.select(verdicts), "first_approved")
    assert out["result"] == "no" and "tool_calls" not in out
    assert (out["reasoning"], out["reasoning_tokens"]) == ("no need", 2)
    out = _selected(row, verdicts[::-1], candidates.select(verdicts[::-1]), "first_approved")
    assert out["tool_calls"] == [call] and out["reasoning"] == "look it up"


async def test_a_judge_that_sees_the_reasoning_sees_the_calls_too() -> None:
    seen: list[GenerationRequest] = []

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        seen.extend(requests)
        return [GenerationResult('{"approved": true, "reason": "ok", "score": 1}') for _ in requests]

    judge = build_judge({"type": "llm", "sees_reasoning": True}, callables=None)
    row = {"prompt": "weather?", "reasoning": "look it up"}
    await judge.judge([JudgeItem(row, "", "1", tool_calls=(PARIS,))], generate)  # type: ignore[attr-defined]
    (prompt,) = (r.messages[-1]["content"] for r in seen)  # type: ignore[index]
    assert "<<<REASONING\nlook it up\nREASONING>>>" in prompt
    assert "Tool calls the answer makes (parsed, not executed)" in prompt and "Paris" in prompt
