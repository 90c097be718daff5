"""The ``openai`` engine: any OpenAI-compatible endpoint (``vllm serve``, hosted APIs).

Requests of a batch go out concurrently (at most ``max_concurrency`` at once). 429 and 5xx answers
and connection errors are retried with exponential backoff, honouring ``Retry-After``; a request
that still fails becomes that request's error result, never an exception over the batch.

A structured output goes as OpenAI's ``response_format`` where it has the kind (a JSON schema, as
``json_schema`` named ``response`` with ``strict: true``: enforced, as vLLM enforces it; a JSON object)
and as vLLM's ``structured_outputs`` otherwise (a regex, a choice, a grammar: ``vllm serve`` takes
them; an API that does not answers that record's error). Tools go as they are (``tools``,
``tool_choice``, ``parallel_tool_calls``: the chat API's fields) and an answer's
``message.tool_calls`` become its :class:`~airflow_batchinfer.engines.tools.ToolCall` s (a message
with calls only has ``content`` null: the answer's text is empty, as it is for any ``content`` null).

Image parts (:mod:`~airflow_batchinfer.engines.images`) go on as OpenAI's ``image_url`` parts, each
a ``data:`` URL of the image the worker loaded (a path or ``s3://`` URI the server could not read).

A reasoning model's reasoning is the message's ``reasoning_content`` (or ``reasoning``, vLLM's newer
name), its tokens ``usage.completion_tokens_details.reasoning_tokens`` (a request's, given to its one
candidate; with ``n`` > 1 no candidate's count is known). A server does not say whether the reasoning
ended: an answer cut at ``max_tokens`` (``length``) with reasoning and no content is taken as cut
while thinking. ``reasoning_effort``, ``chat_template_kwargs`` and ``thinking_token_budget`` go in
the body as vLLM's server takes them (an API that does not answers that record's error). The server
reads a reasoning model's calls from its answer, after the reasoning.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_batchinfer.engines.base import (
    Choice,
    Engine,
    GenerationRequest,
    GenerationResult,
    SecretOption,
    TokenLogprob,
)
from airflow_batchinfer.engines.images import openai_messages
from airflow_batchinfer.engines.reasoning import prompt_refusal
from airflow_batchinfer.engines.stats import TALLIED, EngineStats, StatsTally
from airflow_batchinfer.engines.tools import calls_of
from airflow_batchinfer.exceptions import ConfigError

if TYPE_CHECKING:  # imported on start: every worker imports this module (its secret options), and
    import httpx  # httpx costs tens of ms (with its CLI's click, rich, pygments when installed)

RETRYABLE = {408, 409, 429, 500, 502, 503, 504}


class OpenAIEngine(Engine):
    """:param model: the model name the endpoint serves.
    :param base_url: e.g. ``http://127.0.0.1:8000/v1`` (default ``$OPENAI_BASE_URL``).
    :param api_key: default ``$OPENAI_API_KEY`` (may be empty for local servers). A secret: never an
        engine option; see :attr:`secret_options`.
    :param default_headers: extra HTTP headers for every request (an organisation, a gateway's key),
        default ``$OPENAI_DEFAULT_HEADERS`` (a JSON object). A secret, like ``api_key``."""

    name = "openai"
    stats_fields = TALLIED
    secret_options = (
        SecretOption("api_key", "OPENAI_API_KEY", required=True),
        SecretOption("default_headers", "OPENAI_DEFAULT_HEADERS", is_json=True),
    )

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        max_concurrency: int = 64,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip(
            "/"
        )
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self._headers = {**_env_headers(default_headers)}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._transport = transport
        self._slots = asyncio.Semaphore(max_concurrency)
        self._http: httpx.AsyncClient | None = None
        self.tally = StatsTally()  # requests in flight, and the tokens of their answers

    async def start(self) -> None:
        import httpx

        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, timeout=self.timeout_s, transport=self._transport
        )

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        with self.tally.batch(len(requests)):
            results = list(await asyncio.gather(*(self._one(r) for r in requests)))
        self.tally.count(results)  # the tokens the server's usage reported
        return results

    def stats(self) -> EngineStats:
        return self.tally.stats()

    def _body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            # every other field it honours, passed on where set: a server that does not take one (a
            # vLLM extension such as top_k on OpenAI's API) answers that record's error, naming it
            **s.changed(),
        }
        if s.structured_outputs is not None:  # OpenAI's response_format where it has the kind
            response_format = s.structured_outputs.response_format()
            if response_format is not None:
                del body["structured_outputs"]
                body["response_format"] = response_format
        if request.messages is not None:
            messages = request.messages
            if request.images:  # as data: URLs: the server cannot read the worker's storage
                messages = openai_messages(messages, request.images)
            return "/chat/completions", {**body, "messages": list(messages)}
        if s.logprobs:  # the completions API's logprobs: the number of alternatives per token
            body["logprobs"] = body.pop("top_logprobs", 0)
        return "/completions", {**body, "prompt": request.prompt}

    async def _one(self, request: GenerationRequest) -> GenerationResult:
        import httpx  # loaded by start()

        assert self._http is not None, "start() the engine first"
        s = request.sampling
        if s.tools and request.messages is None:
            return GenerationResult.failed(
                "openai: tools need chat messages (the completions API has no tools): send messages"
            )
        refused = prompt_refusal(s.reasoning_effort, s.chat_template_kwargs, "openai")
        if request.prompt is not None and refused is not None:
            return GenerationResult.failed(refused)
        path, body = self._body(request)
        error = ""
        async with self._slots:
            for attempt in range(self.max_retries + 1):
                try:
                    response = await self._http.post(path, json=body)
                except httpx.TransportError as exc:
                    error, wait = f"{type(exc).__name__}: {exc}", None
                else:
                    if response.status_code == 200:
                        return self._parse(response.json())
                    error = f"HTTP {response.status_code}: {response.text[:300]}"
                    if response.status_code not in RETRYABLE:
                        break
                    wait = _retry_after(response)
                if attempt < self.max_retries:
                    await asyncio.sleep(
                        wait if wait is not None else self.backoff_s * 2**attempt * (0.5 + random.random())
                    )
        return GenerationResult.failed(f"openai endpoint {self.base_url}{path}: {error}")

    @staticmethod
    def _parse(data: dict[str, Any]) -> GenerationResult:
        """A chat or text completion's result: every choice, in index order, with its logprobs."""
        try:
            usage = data.get("usage") or {}
            details = usage.get("completion_tokens_details") or {}
            thought = int(details.get("reasoning_tokens") or 0) if len(data["choices"]) == 1 else 0
            choices = []
            for choice in sorted(data["choices"], key=lambda c: c.get("index", 0)):
                finish = choice.get("finish_reason") or "stop"
                if "message" not in choice:
                    choices.append(Choice(choice["text"], finish, 0, _logprobs(choice)))
                    continue
                message = choice["message"]
                text, reasoning = message.get("content"), _reasoning(message)
                calls = calls_of(message.get("tool_calls"))
                if text is None:  # calls only, or an empty answer: no text, as vLLM's engine gives ""
                    text = ""
                if reasoning is None:
                    choices.append(Choice(text, finish, 0, _logprobs(choice), tool_calls=calls))
                    continue
                cut = finish == "length" and not text and not calls
                choices.append(
                    Choice(text or "", finish, 0, _logprobs(choice), reasoning, thought, not cut, calls)
                )
            result = GenerationResult.of(choices, int(usage.get("prompt_tokens", 0)))
            # usage counts the choices' tokens together, not each one's
            return replace(result, completion_tokens=int(usage.get("completion_tokens", 0)))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return GenerationResult.failed(f"unexpected response shape ({exc}): {str(data)[:300]}")

    def adapter_refusal(self) -> str:
        return (
            "the openai engine sends requests to a server, which owns its adapters: serve them there "
            "(vllm serve --enable-lora --lora-modules NAME=PATH) and run a pool whose model is NAME"
        )

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.model, "base_url": self.base_url}


def _reasoning(message: Mapping[str, Any]) -> str | None:
    """A chat message's reasoning: ``reasoning_content`` (vLLM's and DeepSeek's) or ``reasoning``."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str):
            return value
    return None


def _logprobs(choice: Mapping[str, Any]) -> tuple[TokenLogprob, ...] | None:
    """A choice's ``logprobs``: the chat form (``content``: ``[{token, logprob, top_logprobs}]``) or the
    completions form (``tokens``, ``token_logprobs``, ``top_logprobs``: ``[{token: logprob}]``)."""
    lp = choice.get("logprobs")
    if not lp:
        return None
    if "content" in lp:
        return tuple(TokenLogprob.from_json(t) for t in lp["content"] or ())
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    return tuple(
        TokenLogprob(
            str(t),
            float(v),
            tuple(sorted(((str(a), float(b)) for a, b in (top or {}).items()), key=lambda x: -x[1])),
        )
        for t, v, top in zip(lp["tokens"], lp["token_logprobs"], tops, strict=True)
    )


def _env_headers(given: Mapping[str, str] | None) -> dict[str, str]:
    """``given``, else ``$OPENAI_DEFAULT_HEADERS`` (a JSON object); values are never in the error."""
    if given is None:
        text = os.environ.get("OPENAI_DEFAULT_HEADERS", "").strip()
        try:
            given = json.loads(text) if text else {}
        except ValueError:
            raise ConfigError(
                "$OPENAI_DEFAULT_HEADERS is not JSON: write an object of header names "
                'to values, e.g. {"OpenAI-Organization": "org-1"}'
            ) from None
    if not isinstance(given, Mapping) or not all(isinstance(v, str) for v in given.values()):
        raise ConfigError(
            "default_headers of the openai engine: expected an object of header names to text values"
        )
    return {str(k): v for k, v in given.items()}


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return min(float(response.headers["Retry-After"]), 60.0)
    except (KeyError, ValueError):
        return None
