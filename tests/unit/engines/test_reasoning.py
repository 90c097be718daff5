"""Reasoning models' request fields and the reasoning split (engines.reasoning), without a model:
each field honoured or refused per engine with the reason, job descriptions unchanged where unset,
the delimiter split, the openai engine's reading of a server's reasoning, and the rows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.base import Choice, GenerationResult
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.engines.reasoning import (
    Delimiters,
    TemplateKwargs,
    openai_message,
    row_fields,
    template_kwargs,
)
from airflow_batchinfer.engines.sampling import refusal
from airflow_batchinfer.engines.transformers import TransformersEngine
from airflow_batchinfer.engines.vllm import NO_PARSER, VllmEngine, sampling_args
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker.jobs.infer import generated, openai_batch_row

CHAT = [{"role": "user", "content": "2+2?"}]


def test_a_job_that_asks_for_none_of_them_is_described_as_before() -> None:
    # the job ids of every run that leaves them unset stay what they were
    assert SamplingParams.from_mapping({"max_tokens": 9}).as_dict() == {
        "max_tokens": 9, "temperature": 0.0, "top_p": 1.0, "seed": None, "stop": [],
    }  # fmt: skip
    asked = SamplingParams.from_mapping(
        {"reasoning_effort": "low", "chat_template_kwargs": {"b": [1], "a": True}, "thinking_token_budget": 0}
    )
    assert asked.changed() == {
        "reasoning_effort": "low",
        "chat_template_kwargs": {"a": True, "b": [1]},
        "thinking_token_budget": 0,
    }
    # hashable and canonical: the same object in another key order is the same settings
    again = SamplingParams.from_mapping(
        {"chat_template_kwargs": {"a": True, "b": [1]}, "reasoning_effort": "low", "thinking_token_budget": 0}
    )
    assert hash(asked) == hash(again) and asked == again


@pytest.mark.parametrize(
    ("name", "value", "engine", "named"),
    [
        ("reasoning_effort", "low", "simulated", ["simulated engine", "vllm, transformers, openai"]),
        ("reasoning_effort", "extreme", None, ["reasoning_effort", "is not one of"]),
        ("chat_template_kwargs", {"enable_thinking": False}, "simulated", ["simulated engine"]),
        ("chat_template_kwargs", ["enable_thinking"], None, ["chat_template_kwargs", "not of type"]),
        ("thinking_token_budget", 64, "simulated", ["simulated engine", "vllm, transformers, openai"]),
        ("thinking_token_budget", -1, None, ["thinking_token_budget must be >= 0, got -1"]),
    ],
)
def test_each_field_is_refused_with_the_reason_where_it_cannot_run(
    name: str, value: Any, engine: str | None, named: list[str]
) -> None:
    why = refusal(name, value, engine)
    assert why is not None and all(n in why for n in named), why


@pytest.mark.parametrize(
    ("name", "engine"),
    [(n, e) for n in ("reasoning_effort", "chat_template_kwargs") for e in ("vllm", "transformers", "openai")]
    + [("thinking_token_budget", e) for e in ("vllm", "transformers", "openai")],
)
def test_the_engines_that_honour_them_take_them(name: str, engine: str) -> None:
    value = {"reasoning_effort": "high", "chat_template_kwargs": {"x": 1}, "thinking_token_budget": 16}[name]
    assert refusal(name, value, engine) is None


def test_sampling_params_holds_the_bounds() -> None:
    with pytest.raises(ConfigError, match="choose one of none, minimal, low"):
        SamplingParams(reasoning_effort="loud")
    with pytest.raises(ConfigError, match="thinking_token_budget must be >= 0"):
        SamplingParams(thinking_token_budget=-3)


def test_the_template_gets_them_as_vllms_server_passes_them() -> None:
    assert template_kwargs(None, None) == {}
    assert template_kwargs("none", None) == {"enable_thinking": False, "reasoning_effort": "none"}
    assert template_kwargs("high", None) == {"enable_thinking": True, "reasoning_effort": "high"}
    # the request's own kwargs win over what the effort implies
    kwargs = TemplateKwargs.of({"enable_thinking": True, "x": 2})
    assert template_kwargs("none", kwargs) == {"enable_thinking": True, "x": 2, "reasoning_effort": "none"}


def test_vllm_gets_the_budget_and_renders_the_template_fields_itself() -> None:
    args = sampling_args(SamplingParams.from_mapping({"reasoning_effort": "low", "thinking_token_budget": 5}))
    assert args["thinking_token_budget"] == 5 and "reasoning_effort" not in args
    assert "chat_template_kwargs" not in args


class _Template:
    """A tokenizer's chat template as a stub: what it was rendered with."""

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> str:
        return json.dumps(kwargs, sort_keys=True)


def test_vllm_renders_the_effort_and_refuses_what_it_cannot_run_per_request() -> None:
    engine = VllmEngine("/models/m")
    engine.tokenizer = _Template()
    requests = [
        GenerationRequest("chat", messages=CHAT, sampling=SamplingParams(reasoning_effort="none")),
        GenerationRequest("raw", prompt="2+2?", sampling=SamplingParams(reasoning_effort="low")),
        GenerationRequest("budget", messages=CHAT, sampling=SamplingParams(thinking_token_budget=8)),
    ]
    chat, raw, budget = engine._prompts(requests)
    assert isinstance(chat, str) and json.loads(chat)["enable_thinking"] is False
    assert isinstance(raw, GenerationResult) and "raw prompt" in str(raw.error)
    assert isinstance(budget, GenerationResult) and budget.error == NO_PARSER


def test_the_delimiter_split_is_vllms() -> None:
    start, end = 1, 2
    # the template opened the reasoning: no start token in the output
    assert Delimiters.split_ids([5, 6, end, 7], start, end) == ([5, 6], [7], True)
    assert Delimiters.split_ids([start, 5, end], start, end) == ([5], [], True)
    # no end: all of it is reasoning, not ended
    assert Delimiters.split_ids([5, 6, 7], start, end) == ([5, 6, 7], [], False)


class _Decoder:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def test_the_thinking_budget_forces_the_end_after_that_many_thinking_tokens() -> None:
    import numpy as np  # generate() hands it torch tensors; arrays index and list alike

    from airflow_batchinfer.engines.reasoning import ThinkingBudget

    start, end, inf = 1, 2, float("-inf")
    budget = ThinkingBudget(2, start, end)
    rows = np.array([[9, start, 5, 6], [9, start, 5, 9], [start, 5, end, 6], [9, 9, 9, 9]])
    scores = budget(rows, np.zeros((4, 4)))
    # rows 0 and 1 thought 2 tokens since <think> (the prompt's or their own): only </think> may come
    assert scores[0].tolist() == scores[1].tolist() == [inf, inf, 0.0, inf]
    # row 2 ended its reasoning, row 3 never began one
    assert scores[2].tolist() == scores[3].tolist() == [0.0] * 4
    assert ThinkingBudget(3, start, end)(rows[:1], np.zeros((1, 4))).tolist() == [[0.0] * 4]


def test_transformers_splits_the_generated_tokens() -> None:
    engine = TransformersEngine("/models/m", reasoning_parser="deepseek_r1")
    engine.tokenizer, engine._think_ids = _Decoder(), (1, 2)
    split = engine._split([5, 6, 2, 7, 8])
    assert (split.answer, split.reasoning, split.reasoning_tokens, split.ended) == ("7 8", "5 6", 2, True)
    assert engine.describe()["reasoning_parser"] == "deepseek_r1"
    plain = TransformersEngine("/models/m")
    plain.tokenizer = _Decoder()
    assert plain._split([5, 6, 2]).reasoning is None and "reasoning_parser" not in plain.describe()
    with pytest.raises(ConfigError, match="deepseek_r1, seed_oss"):
        TransformersEngine("/models/m", reasoning_parser="qwen3")


def _served(message: dict[str, Any], finish: str = "stop", **usage: Any) -> GenerationResult:
    data = {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
    return OpenAIEngine._parse(data)


def test_openai_reads_the_servers_reasoning() -> None:
    details = {"completion_tokens_details": {"reasoning_tokens": 7}}
    res = _served({"content": "4", "reasoning_content": "two and two"}, completion_tokens=9, **details)
    assert (res.text, res.reasoning, res.reasoning_tokens, res.reasoning_ended) == (
        "4",
        "two and two",
        7,
        True,
    )
    newer = _served({"content": "4", "reasoning": "two and two"})
    assert newer.reasoning == "two and two"
    cut = _served({"content": None, "reasoning": "two and"}, "length")
    assert (cut.text, cut.reasoning_ended) == ("", False)
    plain = _served({"content": "4"})
    assert plain.reasoning is None and plain.reasoning_ended


async def test_openai_passes_the_fields_on_and_refuses_them_on_a_raw_prompt() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}], "usage": {}})

    engine = OpenAIEngine("m", base_url="http://llm.local/v1", transport=httpx.MockTransport(handler))
    await engine.start()
    asked = SamplingParams.from_mapping({"reasoning_effort": "minimal", "chat_template_kwargs": {"k": 1}})
    chat, raw = await engine.generate(
        [
            GenerationRequest("1", messages=CHAT, sampling=asked),
            GenerationRequest("2", prompt="p", sampling=asked),
        ]
    )
    await engine.close()
    assert chat.ok and (bodies[0]["reasoning_effort"], bodies[0]["chat_template_kwargs"]) == (
        "minimal",
        {"k": 1},
    )
    assert not raw.ok and "raw prompt" in str(raw.error) and len(bodies) == 1


def test_rows_carry_the_reasoning_beside_the_answer() -> None:
    request = GenerationRequest("r", messages=CHAT, sampling=SamplingParams(max_tokens=8))
    thought = Choice("4", "stop", 6, None, "two and two", 4, True)
    row = generated(GenerationResult.of([thought], 3), request)
    assert (row["result"], row["reasoning"], row["reasoning_tokens"]) == ("4", "two and two", 4)
    assert "truncated_in_thinking" not in row
    cut = Choice("", "length", 8, None, "two and", 8, False)
    assert generated(GenerationResult.of([cut], 3), request)["truncated_in_thinking"] is True
    # a model that did not reason: the row it always was
    assert set(generated(GenerationResult.of([Choice("4", "stop", 1)], 3), request)) == {
        "result", "status", "error", "finish_reason", "max_tokens",
    }  # fmt: skip
    # a cut answer whose reasoning ended is a plain length truncation
    assert row_fields("r", 3, True, "length") == {"reasoning": "r", "reasoning_tokens": 3}


def test_openai_lines_carry_the_reasoning_as_vllms_server_does() -> None:
    res = GenerationResult.of(
        [
            Choice("4", "stop", 6, None, "two and two", 4, True),
            Choice("", "length", 8, None, "two", 8, False),
        ],
        3,
    )
    line = openai_batch_row({"custom_id": "c", "body": {"messages": CHAT}}, res, model="m", created=0)
    body = line["response"]["body"]
    assert [c["message"] for c in body["choices"]] == [
        openai_message("assistant", "4", "two and two"),
        {"role": "assistant", "content": None, "reasoning": "two", "reasoning_content": "two"},
    ]
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 12}
    plain = openai_batch_row(
        {"custom_id": "c"}, GenerationResult.of([Choice("4", "stop", 1)], 3), model="m", created=0
    )
    assert plain["response"]["body"]["choices"][0]["message"] == {"role": "assistant", "content": "4"}
    assert "completion_tokens_details" not in plain["response"]["body"]["usage"]


def test_a_selected_candidates_reasoning_is_the_rows() -> None:
    from airflow_batchinfer.judges import candidates
    from airflow_batchinfer.judges.base import Verdict
    from airflow_batchinfer.worker.jobs.judge import _selected

    first = {
        "index": 0,
        "result": "a",
        "reasoning": "ra",
        "reasoning_tokens": 2,
        "truncated_in_thinking": True,
    }
    second = {"index": 1, "result": "b", "reasoning": "rb", "reasoning_tokens": 3}
    row = {"id": 1, **{k: v for k, v in first.items() if k != "index"}, "candidates": [first, second]}
    verdicts = [Verdict(False, "no"), Verdict(True, "yes")]
    chosen = _selected(row, verdicts, candidates.select(verdicts, "first_approved"), "first_approved")
    assert (chosen["result"], chosen["reasoning"], chosen["reasoning_tokens"]) == ("b", "rb", 3)
    assert "truncated_in_thinking" not in chosen


def test_sampling_round_trips_through_its_description() -> None:
    asked = SamplingParams.from_mapping({"chat_template_kwargs": {"enable_thinking": False}})
    assert SamplingParams.from_mapping(asked.as_dict()) == asked
