"""A reasoning model's tool calls: read from the answer after the reasoning, the output parsed once
(vLLM's server's order), the chat template given both the tools and the reasoning variables, and
rows, OpenAI output lines and the openai engine carrying the reasoning and the calls together."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.images import ImageLimits, load_images
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.engines.reasoning import Split
from airflow_batchinfer.engines.tools import ToolCall
from airflow_batchinfer.engines.vllm import VllmEngine
from airflow_batchinfer.engines.vllm_tools import ToolTurn
from airflow_batchinfer.worker.jobs.infer import generated, openai_batch_row
from tests.support.images import data_url, image_message, png

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {
    "id": "call-1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


class _Splitter:
    """The reasoning parser's side: records whether it split a text itself or only counted."""

    def __init__(self) -> None:
        self.split_texts: list[str] = []
        self.counted_ids: list[list[int]] = []

    def split(self, text: str, token_ids: Any, *rest: Any) -> Split:
        self.split_texts.append(text)
        return Split("never used here")

    def counted(self, reasoning: str, answer: str, token_ids: Any) -> Split:
        self.counted_ids.append(list(token_ids))
        return Split(answer, reasoning, 3, True)


def test_vllm_reads_the_reasoning_then_the_calls_from_the_answer_parsing_the_output_once() -> None:
    engine = VllmEngine("/models/m")
    splitter = _Splitter()
    engine.splitter = splitter  # type: ignore[assignment]
    seen: list[str] = []

    def parse(text: str, *a: Any, **k: Any) -> tuple[str, str, list[Any]]:
        seen.append(text)  # vLLM's composed parser: the reasoning split off, the calls read after it
        return "let me look it up", "", [SimpleNamespace(id="call-1", name="get_weather", arguments="{}")]

    turn = ToolTurn(
        SimpleNamespace(tool_choice="auto", parallel_tool_calls=True), SimpleNamespace(parse=parse)
    )
    out = SimpleNamespace(
        text="<think>let me look it up</think><tool_call>...", token_ids=[1, 2, 3], finish_reason="stop"
    )
    request = GenerationRequest(
        "1", messages=MESSAGES, sampling=SamplingParams.from_mapping({"tools": [WEATHER]})
    )
    split, calls, finish = engine._read(request, out, turn)
    assert seen == [out.text] and splitter.split_texts == []  # parsed once, by the composed parser
    assert splitter.counted_ids == [[1, 2, 3]]  # the reasoning parser only counts its tokens
    assert (split.reasoning, split.answer, split.reasoning_tokens) == ("let me look it up", "", 3)
    assert calls == (ToolCall("call-1", "get_weather", "{}"),) and finish == "tool_calls"
    # tool_choice none: no call parsed, the reasoning parser splits the output as for any request
    engine._read(request, out, ToolTurn(turn.chat, None))
    assert splitter.split_texts == [out.text]


class _Template:
    def apply_chat_template(self, messages: Any, **kwargs: Any) -> str:
        return json.dumps({**kwargs, "messages": messages}, sort_keys=True)


def test_vllm_renders_the_tools_and_the_reasoning_variables_together() -> None:
    engine = VllmEngine("/models/m")
    engine.tokenizer = _Template()
    tool = SimpleNamespace(model_dump=lambda: WEATHER)
    turn = ToolTurn(SimpleNamespace(tools=[tool]), None)
    engine.tools = SimpleNamespace(refusal=lambda r: None, turn=lambda r: turn)  # type: ignore[assignment]
    sampling = SamplingParams.from_mapping({"tools": [WEATHER], "reasoning_effort": "none"})
    ((prompt, made),) = engine._prompts([GenerationRequest("1", messages=MESSAGES, sampling=sampling)])  # type: ignore[misc]
    rendered = json.loads(str(prompt))
    assert made is turn and rendered["tools"] == [WEATHER]
    assert rendered["enable_thinking"] is False and rendered["reasoning_effort"] == "none"


async def test_the_openai_engine_reads_reasoning_and_calls_into_rows_and_output_lines() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        message = {
            "role": "assistant",
            "content": None,
            "reasoning_content": "look it up",
            "tool_calls": [CALL],
        }
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        usage = {
            "prompt_tokens": 9,
            "completion_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 3},
        }
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    engine = OpenAIEngine(
        "m", base_url="http://llm.local/v1", api_key="k", transport=httpx.MockTransport(handler)
    )
    await engine.start()
    sampling = SamplingParams.from_mapping({"tools": [WEATHER], "reasoning_effort": "low"})
    request = GenerationRequest("1", messages=MESSAGES, sampling=sampling)
    (res,) = await engine.generate([request])
    await engine.close()
    (body,) = bodies
    assert body["tools"] == [WEATHER] and body["reasoning_effort"] == "low"
    assert (res.text, res.reasoning, res.reasoning_tokens, res.reasoning_ended) == ("", "look it up", 3, True)
    assert res.tool_calls == (ToolCall.from_json(CALL),)
    row = generated(res, request)
    assert row["result"] == "" and row["reasoning"] == "look it up" and row["tool_calls"] == [CALL]
    assert "truncated_in_thinking" not in row
    line = openai_batch_row({"custom_id": "1", "body": {"messages": MESSAGES}}, res, model="m", created=1)
    message = line["response"]["body"]["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"] == [CALL]
    assert message["reasoning"] == message["reasoning_content"] == "look it up"


def test_vllm_renders_an_image_request_with_its_tools_and_reasoning_variables() -> None:
    pytest.importorskip("PIL", reason="needs pillow (the transformers extra)")
    engine = VllmEngine("/models/vlm")
    engine.tokenizer = _Template()
    engine.llm = SimpleNamespace(model_config=SimpleNamespace(is_multimodal_model=True))
    turn = ToolTurn(SimpleNamespace(tools=[SimpleNamespace(model_dump=lambda: WEATHER)]), None)
    engine.tools = SimpleNamespace(refusal=lambda r: None, turn=lambda r: turn)  # type: ignore[assignment]
    sampling = SamplingParams.from_mapping(
        {"tools": [WEATHER], "chat_template_kwargs": {"enable_thinking": True}}
    )
    asked = GenerationRequest(
        "1", messages=image_message(data_url(png(2, 2)), "weather here?"), sampling=sampling
    )
    ((prompt, made),) = engine._prompts([load_images(asked, ImageLimits())])  # type: ignore[misc]
    assert made is turn and isinstance(prompt, dict)
    rendered = json.loads(prompt["prompt"])
    assert rendered["tools"] == [WEATHER] and rendered["enable_thinking"] is True
    assert rendered["messages"][0]["content"] == [
        {"type": "text", "text": "weather here?"},
        {"type": "image"},
    ]
    assert [i.size for i in prompt["multi_modal_data"]["image"]] == [(2, 2)]
