"""compare_lines (airflow_batchinfer/dev/run_batch.py), the parity rule between our OpenAI batch output
lines and ``vllm run-batch``'s: what it allows to differ, and that anything else is reported."""

from __future__ import annotations

import copy
from typing import Any

from airflow_batchinfer.dev.run_batch import compare_lines, engine_flags
from airflow_batchinfer.engines.base import Choice, GenerationResult, TokenLogprob
from airflow_batchinfer.engines.tools import ToolCall
from airflow_batchinfer.worker.jobs.infer import openai_batch_row

RECORD = {"custom_id": "a", "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}}
LOGPROBS = (TokenLogprob("x", -0.5, (("x", -0.5), ("y", -1.5), ("z", -2.0))),)


def ours() -> dict[str, Any]:
    res = GenerationResult(
        "x", finish_reason="length", prompt_tokens=5, completion_tokens=1, logprobs=LOGPROBS
    )
    return openai_batch_row(RECORD, res, model="/models/tiny", created=1)


def vllms() -> dict[str, Any]:
    """What run-batch 0.32 writes for the same answer: its own ids and time, its extension fields
    (``null`` or set), the sampled token first in ``top_logprobs``."""
    top = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in (("x", -0.5), ("y", -1.5))]
    content = [{"token": "x", "logprob": -0.50004, "bytes": [120], "top_logprobs": top}]
    choice = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": "x",
            "refusal": None,
            "tool_calls": [],
            "reasoning": None,
        },
        "logprobs": {"content": content},
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": None,
    }
    body = {
        "id": "chatcmpl-9f2",
        "object": "chat.completion",
        "created": 1765130000,
        "model": "tiny",
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": "vllm-0.32.0-0e92eaef",
        "usage": {
            "prompt_tokens": 5,
            "total_tokens": 6,
            "completion_tokens": 1,
            "prompt_tokens_details": None,
        },
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }
    return {
        "id": "vllm-1b3",
        "custom_id": "a",
        "response": {"status_code": 200, "request_id": "vllm-batch-77", "body": body},
        "error": None,
    }


def test_the_same_answer_is_the_same_line_whatever_the_ids_times_and_unset_extensions() -> None:
    assert compare_lines({"a": ours()}, {"a": vllms()}) == []


def test_a_different_text_finish_reason_usage_or_logprob_is_reported_by_its_path() -> None:
    for path, value in [
        (("choices", 0, "message", "content"), "y"),
        (("choices", 0, "finish_reason"), "stop"),
        (("usage", "completion_tokens"), 2),
        (("choices", 0, "logprobs", "content", 0, "logprob"), -0.6),
        (("choices", 0, "stop_reason"), "."),  # allowed: vLLM's extension
        (("choices", 0, "message", "reasoning"), "because"),  # set on one side only
    ]:
        theirs = copy.deepcopy(vllms())
        target = theirs["response"]["body"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        found = compare_lines({"a": ours()}, {"a": theirs})
        dotted = "response.body." + ".".join(map(str, path))
        assert found == ([] if path[-1] == "stop_reason" else [found[0]]), (path, found)
        assert not found or found[0].startswith(f"a: {dotted}: ours "), found


def test_other_alternatives_in_top_logprobs_are_reported() -> None:
    theirs = vllms()
    theirs["response"]["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"] = "z"
    (found,) = compare_lines({"a": ours()}, {"a": theirs})
    assert found.startswith("a: response.body.choices.0.logprobs.content.0.top_logprobs: ")


def test_a_failure_matches_a_failure_and_not_an_answer() -> None:
    mine = openai_batch_row(RECORD, GenerationResult.failed("prompt too long"), model="m", created=1)
    theirs = {
        "id": "vllm-2",
        "custom_id": "a",
        "response": {"status_code": 400, "request_id": "vllm-batch-3", "body": None},
        "error": {"error": {"message": "This model's maximum context length is 512", "code": 400}},
    }
    assert compare_lines({"a": mine}, {"a": theirs}) == []
    (found,) = compare_lines({"a": mine}, {"a": vllms()})
    assert found == "a: ours failed: {'code': 'inference_error', 'message': 'prompt too long'}"
    assert compare_lines({"a": mine}, {}) == ["a: only ours"]


def test_n_choices_are_compared_each() -> None:
    two = (Choice("x", "length", 1), Choice("w", "length", 1))
    res = GenerationResult("x", finish_reason="length", prompt_tokens=5, completion_tokens=2, choices=two)
    theirs = vllms()
    body = theirs["response"]["body"]
    body["usage"].update(completion_tokens=2, total_tokens=7)
    body["choices"] = [
        {**body["choices"][0], "logprobs": None},
        {**body["choices"][0], "index": 1, "logprobs": None},
    ]
    body["choices"][1]["message"] = {"role": "assistant", "content": "v"}
    found = compare_lines({"a": openai_batch_row(RECORD, res, model="m", created=1)}, {"a": theirs})
    assert found == ['a: response.body.choices.1.message.content: ours "w", vLLM\'s "v"']


def test_engine_args_become_the_same_flags_for_run_batch() -> None:
    flags = engine_flags(
        {"max_model_len": 512, "enforce_eager": True, "enable_lora": False, "dtype": "float32"}
    )
    assert flags == ["--max-model-len", "512", "--enforce-eager", "--dtype", "float32"]


def test_tool_call_ids_may_differ_their_names_and_arguments_not() -> None:
    call = ToolCall("chatcmpl-tool-1", "get_weather", '{"city": "Paris"}')
    mine = openai_batch_row(
        RECORD,
        GenerationResult(
            "", finish_reason="tool_calls", prompt_tokens=5, completion_tokens=1, tool_calls=(call,)
        ),
        model="m",
        created=1,
    )
    theirs = vllms()
    choice = theirs["response"]["body"]["choices"][0]
    choice.update(logprobs=None, finish_reason="tool_calls")
    choice["message"].update(content=None, tool_calls=[{**call.as_json(), "id": "chatcmpl-tool-2"}])
    assert compare_lines({"a": mine}, {"a": theirs}) == []  # vLLM's ids are random: allowed
    choice["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Rome"}'
    (found,) = compare_lines({"a": mine}, {"a": theirs})
    assert found.startswith("a: response.body.choices.0.message.tool_calls.0.function.arguments: ours ")
