"""Tool calls from the openai engine into rows and OpenAI batch output lines: what goes to the
server, what comes back, the shape vLLM's server writes (``tool_calls`` only when there are some,
``content`` null when the message says nothing else)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.base import Choice, GenerationResult
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.engines.tools import ToolCall
from airflow_batchinfer.engines.vllm_tools import ToolTurn, VllmTools
from airflow_batchinfer.worker.jobs.infer import generated, openai_batch_row

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {
    "id": "call-1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


async def test_the_openai_engine_sends_the_tools_and_reads_the_calls() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        message = {"role": "assistant", "content": None, "tool_calls": [CALL]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        return httpx.Response(
            200, json={"choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}
        )

    engine = OpenAIEngine(
        "m", base_url="http://llm.local/v1", api_key="k", transport=httpx.MockTransport(handler)
    )
    await engine.start()
    asked = SamplingParams.from_mapping(
        {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    )
    chat, completion = await engine.generate(
        [
            GenerationRequest("1", messages=MESSAGES, sampling=asked),
            GenerationRequest("2", prompt="p", sampling=asked),
        ]
    )
    await engine.close()
    (body,) = bodies  # the completions prompt never went out
    assert (body["tools"], body["tool_choice"], body["parallel_tool_calls"]) == ([WEATHER], "required", False)
    assert chat.ok and chat.text == "" and chat.finish_reason == "tool_calls"
    assert chat.tool_calls == (ToolCall("call-1", "get_weather", '{"city": "Paris"}'),)
    assert not completion.ok and "tools need chat messages" in str(completion.error)


def test_rows_and_batch_output_lines_carry_the_calls_as_vllm_s_server_writes_them() -> None:
    call = ToolCall.from_json(CALL)
    res = GenerationResult.of([Choice("", "tool_calls", 5, None, tool_calls=(call,))], 9)
    row = generated(res, GenerationRequest("1", messages=MESSAGES))
    assert (row["result"], row["finish_reason"], row["tool_calls"]) == ("", "tool_calls", [CALL])
    record = {"custom_id": "a", "body": {"messages": MESSAGES, "tools": [WEATHER]}}
    (choice,) = openai_batch_row(record, res, model="m", created=1)["response"]["body"]["choices"]
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert choice["finish_reason"] == "tool_calls"
    # text before the calls stays the content; an answer without calls has no tool_calls key
    said = GenerationResult.of([Choice("Let me look.", "tool_calls", 5, None, tool_calls=(call,))], 9)
    (choice,) = openai_batch_row(record, said, model="m", created=1)["response"]["body"]["choices"]
    assert choice["message"]["content"] == "Let me look." and choice["message"]["tool_calls"] == [CALL]
    plain = GenerationResult.of([Choice("sunny", "stop", 1)], 9)
    (choice,) = openai_batch_row(record, plain, model="m", created=1)["response"]["body"]["choices"]
    assert choice["message"] == {"role": "assistant", "content": "sunny"}
    assert "tool_calls" not in generated(plain, None)


def test_each_candidate_carries_its_own_calls() -> None:
    call = ToolCall.from_json(CALL)
    res = GenerationResult.of(
        [Choice("", "tool_calls", 5, None, tool_calls=(call,)), Choice("no", "stop", 1)], 9
    )
    row = generated(
        res, GenerationRequest("1", messages=MESSAGES, sampling=SamplingParams(n=2, temperature=1))
    )
    assert row["tool_calls"] == [CALL]  # the first candidate's
    assert [c.get("tool_calls") for c in row["candidates"]] == [[CALL], None]


def test_a_vllm_pool_without_a_tool_parser_refuses_calls_saying_how_to_pin_one() -> None:
    tools = VllmTools(None, tokenizer=None, model_config=None)  # no parser: nothing of vLLM's is loaded
    asked = SamplingParams.from_mapping({"tools": [WEATHER]})
    why = tools.refusal(GenerationRequest("1", messages=MESSAGES, sampling=asked))
    assert why is not None and '"tool_parser"' in why and "hermes" in why
    none = SamplingParams.from_mapping({"tools": [WEATHER], "tool_choice": "none"})
    assert tools.refusal(GenerationRequest("1", messages=MESSAGES, sampling=none)) is None  # rendered only
    assert "chat messages" in str(tools.refusal(GenerationRequest("1", prompt="p", sampling=asked)))
    assert tools.refusal(GenerationRequest("1", messages=MESSAGES)) is None  # no tools: nothing to say
    tools.name = "hermes"  # as if pinned (its parser is not needed to refuse)
    both = SamplingParams.from_mapping(
        {"tools": [WEATHER], "tool_choice": "required", "structured_outputs": {"regex": "x"}}
    )
    why = tools.refusal(GenerationRequest("1", messages=MESSAGES, sampling=both))
    assert why is not None and "remove structured_outputs" in why


@pytest.mark.parametrize(
    ("choice", "parallel", "finish", "found", "expected"),
    [
        ("auto", True, "stop", 2, ("tool_calls", 2)),  # calls made under auto
        ("auto", True, "length", 1, ("tool_calls", 1)),  # whatever stopped it, as vLLM's server says
        ("auto", True, "stop", 0, ("stop", 0)),
        ("required", True, "stop", 1, ("tool_calls", 1)),
        ("required", True, "length", 1, ("length", 1)),
        ("named", True, "stop", 1, ("stop", 1)),  # a named call keeps its own
        ("auto", False, "stop", 2, ("tool_calls", 1)),  # parallel_tool_calls false: the first call
    ],
)
def test_a_vllm_answer_s_calls_and_finish_reason_as_vllm_s_server_gives_them(
    choice: str, parallel: bool, finish: str, found: int, expected: tuple[str, int]
) -> None:
    calls = [SimpleNamespace(id=f"call-{i}", name="get_weather", arguments="{}") for i in range(found)]
    parser = SimpleNamespace(parse=lambda *a, **k: (None, "said" if not found else None, calls))
    tool_choice = (
        choice if choice != "named" else SimpleNamespace(function=SimpleNamespace(name="get_weather"))
    )
    chat = SimpleNamespace(tool_choice=tool_choice, parallel_tool_calls=parallel)
    reasoning, text, made, reason = ToolTurn(chat, parser).calls("raw", [1, 2], finish)
    assert reasoning is None
    assert (reason, len(made or ())) == expected
    assert text == ("" if found else "said") and (made is None) == (expected[1] == 0)
    assert ToolTurn(chat, None).calls("raw", [], "stop") == (None, "raw", None, "stop")  # tool_choice none
