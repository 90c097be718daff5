"""The OpenAI-compatible engine against an injected transport: retries, backoff, per-element errors."""

from __future__ import annotations

import json

import httpx

from airflow_batchinfer.engines import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.openai import OpenAIEngine


def chat(content: str) -> dict[str, object]:
    return {
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }


async def test_chat_and_completion_requests_with_retries() -> None:
    attempts: dict[str, int] = {}
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        key = json.dumps(body.get("messages") or body.get("prompt"))
        attempts[key] = attempts.get(key, 0) + 1
        if "flaky" in key and attempts[key] < 3:
            return httpx.Response(429 if attempts[key] == 1 else 503, headers={"Retry-After": "0"})
        if "never" in key:
            return httpx.Response(500, text="always broken")
        if "invalid" in key:
            return httpx.Response(400, text="bad request")
        if request.url.path.endswith("/completions") and "prompt" in body:
            return httpx.Response(200, json={"choices": [{"text": "raw!", "finish_reason": "length"}]})
        return httpx.Response(200, json=chat(f"echo {key}"))

    engine = OpenAIEngine(
        "m",
        base_url="http://llm.local/v1",
        api_key="k",
        max_retries=3,
        backoff_s=0.001,
        transport=httpx.MockTransport(handler),
    )
    await engine.start()
    sp = SamplingParams(max_tokens=7, temperature=0.5, seed=3, stop=("X",))
    reqs = [
        GenerationRequest("1", messages=[{"role": "user", "content": "flaky"}], sampling=sp),
        GenerationRequest("2", messages=[{"role": "user", "content": "never"}], sampling=sp),
        GenerationRequest("3", prompt="plain", sampling=sp),
        GenerationRequest("4", messages=[{"role": "user", "content": "invalid"}], sampling=sp),
    ]
    out = await engine.generate(reqs)
    await engine.close()
    assert out[0].ok and "flaky" in (out[0].text or "") and out[0].prompt_tokens == 3
    assert attempts[json.dumps([{"role": "user", "content": "flaky"}])] == 3  # 429, 503, then 200
    assert not out[1].ok and "HTTP 500" in (out[1].error or "")
    assert attempts[json.dumps([{"role": "user", "content": "never"}])] == 4  # 1 + max_retries
    assert out[2].text == "raw!" and out[2].finish_reason == "length"
    assert (
        not out[3].ok and attempts[json.dumps([{"role": "user", "content": "invalid"}])] == 1
    )  # 400: no retry
    first = bodies[0]
    assert (first["model"], first["max_tokens"], first["seed"], first["stop"]) == ("m", 7, 3, ["X"])


async def test_unexpected_response_shape_is_an_error_result() -> None:
    engine = OpenAIEngine(
        "m", base_url="http://x/v1", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={}))
    )
    await engine.start()
    (out,) = await engine.generate([GenerationRequest("1", prompt="p")])
    assert not out.ok and "unexpected response shape" in (out.error or "")


def test_a_message_with_content_null_and_nothing_else_is_an_empty_answer() -> None:
    data = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "stop"}]
    }
    res = OpenAIEngine._parse(data)
    assert res.ok and res.text == "" and res.finish_reason == "stop"  # judged as an answer, not "error: None"
