"""Tool calls, step one: ``tools``/``tool_choice``/``parallel_tool_calls`` in the one description of
request fields, carried on SamplingParams in a hashable form, and a call's OpenAI form."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.sampling import refusals
from airflow_batchinfer.engines.tools import NamedTool, Tool, ToolCall, calls_of
from airflow_batchinfer.exceptions import ConfigError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_tools_are_honoured_by_vllm_and_openai_and_refused_elsewhere_with_the_reason() -> None:
    body = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    assert refusals(body, "vllm") == [] and refusals(body, "openai") == []
    for engine in ("transformers", "simulated"):
        why = refusals(body, engine)
        assert len(why) == 3 and all(f"{engine} engine does not honour it" in w for w in why), why
        assert "(vllm, openai)" in why[0]
    # what asks for nothing runs everywhere
    assert refusals({"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}, "simulated") == []


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"tools": [{"type": "function"}]}, "'function' is a required property"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "'function' was expected"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "not of type 'object'",
        ),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "does not match"),
        ({"tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice"),
    ],
)
def test_a_tools_array_or_choice_of_the_wrong_shape_is_refused(value: dict[str, Any], named: str) -> None:
    (why,) = refusals(value, "vllm")
    assert named in why and "fix or remove it" in why, why


def test_the_deprecated_functions_are_refused_saying_how_to_write_them_as_tools() -> None:
    (why,) = refusals({"functions": [WEATHER["function"]]}, "vllm")
    assert "deprecated form of tools" in why and "{type: function, function: f}" in why
    (why,) = refusals({"function_call": {"name": "get_weather"}}, "openai")
    assert "tool_choice" in why


def test_sampling_params_carry_tools_hashable_and_give_openai_s_objects_back() -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    s = SamplingParams.from_mapping({"tools": [WEATHER, TIME], "tool_choice": named})
    assert s.tools == (Tool.of(WEATHER), Tool.of(TIME)) and s.tool_choice == NamedTool("get_time")
    assert hash(s) == hash(SamplingParams.from_mapping({"tools": [WEATHER, TIME], "tool_choice": named}))
    assert s.changed() == {
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
    }
    assert s.tools[0].parameters == WEATHER["function"]["parameters"] and s.tools[1].parameters is None
    # a request without tools describes (and so identifies its job) as it always did
    plain = SamplingParams()
    for asked in (
        {"tools": []},
        {"tool_choice": "auto"},
        {"tool_choice": "none"},
        {"parallel_tool_calls": False},
    ):
        assert SamplingParams.from_mapping(asked) == plain, asked
    assert SamplingParams.from_mapping({"tools": [TIME], "parallel_tool_calls": False}).changed() == {
        "tools": [TIME], "parallel_tool_calls": False
    }  # fmt: skip


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"tool_choice": "required"}, "offers no tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
         "'get_time', which tools do not offer (get_weather)"),
        ({"tools": [WEATHER, WEATHER]}, "name a function twice"),
    ],
)  # fmt: skip
def test_a_choice_the_tools_cannot_meet_is_refused(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        SamplingParams.from_mapping(values)


def test_sampling_params_built_directly_take_only_a_mode_or_a_named_function() -> None:
    with pytest.raises(ConfigError, match="choose one of none, auto, required"):
        SamplingParams(tools=(Tool.of(WEATHER),), tool_choice="always")


def test_the_tools_count_in_a_request_s_token_estimate() -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain = GenerationRequest("r", messages=messages)
    offered = GenerationRequest(
        "r", messages=messages, sampling=SamplingParams.from_mapping({"tools": [WEATHER]})
    )
    assert offered.prompt_chars() == plain.prompt_chars() + len(Tool.of(WEATHER).spec)


def test_a_call_s_openai_form_and_its_arguments() -> None:
    call = ToolCall("call-1", "get_weather", '{"city": "Paris"}')
    assert call.as_json() == {
        "id": "call-1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert calls_of([call.as_json()]) == (call,) and calls_of([]) is None
    assert call.parsed_arguments() == ({"city": "Paris"}, None)
    value, why = ToolCall("c", "f", '{"city": ').parsed_arguments()
    assert value is None and why is not None and "not JSON" in why
    assert "not a JSON object" in str(ToolCall("c", "f", "[1]").parsed_arguments()[1])
    # an object given for the arguments is taken as its JSON text
    assert (
        ToolCall.from_json({"id": "x", "function": {"name": "f", "arguments": {"a": 1}}}).arguments
        == '{"a": 1}'
    )
