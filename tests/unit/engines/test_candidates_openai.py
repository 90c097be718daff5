"""Candidates and logprobs through the openai engine and into OpenAI batch output lines (issue 25,
item 3): what goes to the server, what comes back, both in the chat and the completions forms."""

from __future__ import annotations

import json
from typing import Any

import httpx

from airflow_batchinfer.engines import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.base import Choice, GenerationResult, TokenLogprob
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.worker.jobs.infer import generated, openai_batch_row

HI = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}
YO = {"token": "Yo", "logprob": -2.5, "bytes": [89, 111]}
CHAT_LOGPROBS = {"content": [{**HI, "top_logprobs": [HI, YO]}]}
TEXT_LOGPROBS = {
    "tokens": ["Hi"],
    "token_logprobs": [-0.1],
    "top_logprobs": [{"Yo": -2.5, "Hi": -0.1}],
    "text_offset": [0],
}


async def test_the_openai_engine_asks_for_candidates_and_reads_every_choice() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        chat = "messages" in body
        choices = [
            {"index": i, "finish_reason": "stop" if i else "length",
             **({"message": {"role": "assistant", "content": "Hi"}} if chat else {"text": "Hi"}),
             "logprobs": CHAT_LOGPROBS if chat else TEXT_LOGPROBS}
            for i in reversed(range(body["n"]))
        ]  # fmt: skip
        return httpx.Response(
            200, json={"choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        )

    engine = OpenAIEngine(
        "m", base_url="http://llm.local/v1", api_key="k", transport=httpx.MockTransport(handler)
    )
    await engine.start()
    asked = SamplingParams.from_mapping({"n": 2, "temperature": 1.0, "logprobs": True, "top_logprobs": 2})
    chat, text = await engine.generate(
        [
            GenerationRequest("1", messages=[{"role": "user", "content": "hello"}], sampling=asked),
            GenerationRequest("2", prompt="hello", sampling=asked),
        ]
    )
    await engine.close()
    assert (bodies[0]["n"], bodies[0]["logprobs"], bodies[0]["top_logprobs"]) == (2, True, 2)
    # the completions API's logprobs is the number of alternatives
    assert (bodies[1]["n"], bodies[1]["logprobs"], "top_logprobs" in bodies[1]) == (2, 2, False)
    expected = (TokenLogprob("Hi", -0.1, (("Hi", -0.1), ("Yo", -2.5))),)
    for result in (chat, text):
        assert [c.finish_reason for c in result.candidates] == ["length", "stop"]  # in index order
        assert all(c.logprobs == expected for c in result.candidates)
        assert (result.prompt_tokens, result.completion_tokens) == (3, 2)  # usage: the choices together


def test_batch_output_lines_carry_a_choice_per_candidate_with_logprobs_in_openais_forms() -> None:
    lp = (TokenLogprob("Hi", -0.1, (("Hi", -0.1), ("Yo", -2.5))),)
    res = GenerationResult.of([Choice("Hi", "stop", 1, lp), Choice("Yo", "length", 1, lp)], 3)
    chat = {"custom_id": "a", "body": {"messages": [{"role": "user", "content": "x"}]}}
    line = openai_batch_row(chat, res, model="m", created=1)["response"]["body"]
    assert [c["message"]["content"] for c in line["choices"]] == ["Hi", "Yo"]
    assert [c["index"] for c in line["choices"]] == [0, 1]
    assert line["choices"][1]["logprobs"] == CHAT_LOGPROBS and line["usage"]["completion_tokens"] == 2
    text = openai_batch_row({"custom_id": "b", "body": {"prompt": "x"}}, res, model="m", created=1)
    choice = text["response"]["body"]["choices"][0]
    assert choice["text"] == "Hi" and choice["logprobs"] == {
        **TEXT_LOGPROBS,
        "top_logprobs": [{"Hi": -0.1, "Yo": -2.5}],
    }
    plain = openai_batch_row(chat, GenerationResult("Hi", finish_reason="stop"), model="m", created=1)
    assert plain["response"]["body"]["choices"][0]["logprobs"] is None  # not asked for


def test_a_rows_fields_carry_logprobs_and_candidates_only_when_there_are() -> None:
    lp = (TokenLogprob("Hi", -0.1),)
    request = GenerationRequest("1", prompt="p", sampling=SamplingParams(n=2, temperature=1.0, logprobs=True))
    fields = generated(
        GenerationResult.of([Choice("Hi", "stop", 1, lp), Choice("Yo", "stop", 1, lp)], 3), request
    )
    assert fields["result"] == "Hi" and fields["logprobs"] == [
        {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}
    ]
    assert [(c["index"], c["result"]) for c in fields["candidates"]] == [(0, "Hi"), (1, "Yo")]
    plain = generated(GenerationResult("Hi", finish_reason="stop"), GenerationRequest("1", prompt="p"))
    assert "logprobs" not in plain and "candidates" not in plain


def test_vllms_logprobs_are_read_by_rank_leaving_out_the_sampled_token_it_adds() -> None:
    from types import SimpleNamespace as NS

    from airflow_batchinfer.engines.vllm import _logprobs

    def lp(logprob: float, rank: int, text: str) -> NS:
        return NS(logprob=logprob, rank=rank, decoded_token=text)

    # position 0: the sampled token (id 9, rank 3) is not among the 2 likeliest; position 1: it is
    out = NS(
        token_ids=[9, 5],
        logprobs=[
            {9: lp(-3.0, 3, " c"), 1: lp(-0.5, 1, " a"), 2: lp(-1.0, 2, " b")},
            {5: lp(-0.1, 1, "!"), 6: lp(-2.0, 2, "?")},
        ],
    )
    got = _logprobs(out, 2, tokenizer=None)
    assert got == (
        TokenLogprob(" c", -3.0, ((" a", -0.5), (" b", -1.0))),
        TokenLogprob("!", -0.1, (("!", -0.1), ("?", -2.0))),
    )
