"""The engine interface: a batch of generation requests in, one result per request out, in order.

Engines are total: a per-element failure (prompt too long, a decode error, an HTTP error for one
request) becomes a :class:`GenerationResult` with ``error`` set. Only engine-fatal errors (the model
cannot run at all) raise, and they fail the shard job, not the worker.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from airflow_batchinfer.engines import images as image_parts
from airflow_batchinfer.engines.adapters import Adapter
from airflow_batchinfer.engines.pooling import EmbeddingModel, EmbedRequest, EmbedResult
from airflow_batchinfer.engines.reasoning import EFFORTS, TemplateKwargs
from airflow_batchinfer.engines.sampling import bounds_refusal, completion_tokens, engine_refusal, honoured
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult, ScoringModel
from airflow_batchinfer.engines.stats import EngineStats
from airflow_batchinfer.engines.structured import StructuredOutput
from airflow_batchinfer.engines.structured import read as read_structured
from airflow_batchinfer.engines.tools import (
    NamedTool,
    Tool,
    ToolCall,
    ToolChoice,
    choice_problem,
    tool_changes,
)
from airflow_batchinfer.exceptions import ConfigError

#: The sleep levels (:meth:`Engine.sleep`): 1 keeps the weights in CPU memory, 2 drops them.
SLEEP_LEVELS = (1, 2)


def level_refusal(engine: str, level: int) -> str | None:
    """Why ``level`` is no sleep level (``None``: it is one)."""
    if level in SLEEP_LEVELS:
        return None
    return (
        f"the {engine} engine: sleep level {level} is not one: choose 1 (weights to CPU memory) or 2 "
        "(dropped)"
    )


# The fields as_dict() always writes: what a job's manifest and an llm judge's description said
# before the others existed, so what was recorded then reads the same now.
_ALWAYS_SHOWN = ("max_tokens", "temperature", "top_p", "seed", "stop")
_FLOATS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
_INTS = ("seed", "top_k", "min_tokens", "n", "top_logprobs", "thinking_token_budget")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings: the honoured fields of :data:`~airflow_batchinfer.engines.sampling.
    REQUEST_FIELDS` (:data:`~airflow_batchinfer.engines.sampling.PARAM_FIELDS`, a test holds them
    equal), with their bounds. ``from_mapping`` reads them from a ``sampling`` param or an OpenAI
    request body; what it does not read is refused there first (``sampling.refusals``)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), by token id: hashable
    ignore_eos: bool = False
    # one constraint, from structured_outputs or response_format (engines.structured): canonical, hashable
    structured_outputs: StructuredOutput | None = None
    n: int = 1  # candidates per request: a GenerationResult's choices
    logprobs: bool = False  # each generated token's log probability, with top_logprobs alternatives
    top_logprobs: int = 0
    # reasoning models (engines.reasoning): to the chat template, and vLLM's thinking budget
    reasoning_effort: str | None = None
    chat_template_kwargs: TemplateKwargs | None = None  # a JSON object, hashable
    thinking_token_budget: int | None = None
    tools: tuple[Tool, ...] = ()  # offered to the model (engines.tools); its calls are parsed, not run
    tool_choice: ToolChoice | None = None  # None: auto where tools are given
    parallel_tool_calls: bool = True

    def __post_init__(self) -> None:
        for name in (
            "max_tokens",
            *_FLOATS,
            "top_k",
            "min_tokens",
            "n",
            "top_logprobs",
            "thinking_token_budget",
        ):
            value = getattr(self, name)
            refusal = None if value is None else bounds_refusal(name, value)
            if refusal is not None:
                raise ConfigError(refusal)
        if self.reasoning_effort is not None and self.reasoning_effort not in EFFORTS:
            raise ConfigError(
                f"reasoning_effort {self.reasoning_effort!r} is not an effort: choose one of "
                f"{', '.join(EFFORTS)}"
            )
        if self.min_tokens > self.max_tokens:
            raise ConfigError(
                f"min_tokens {self.min_tokens} is above max_tokens {self.max_tokens}: lower min_tokens "
                "or raise max_tokens"
            )
        if self.n > 1 and self.temperature == 0:
            raise ConfigError(
                f"n {self.n} with temperature 0 is one greedy answer {self.n} times (vLLM refuses it): set "
                "temperature above 0 for different candidates, or n to 1"
            )
        if self.top_logprobs and not self.logprobs:
            raise ConfigError(
                f"top_logprobs {self.top_logprobs} asks for alternatives of each token's log probability: "
                "set logprobs true too (as OpenAI's API asks), or remove top_logprobs"
            )
        problem = choice_problem(self.tools, self.tool_choice)
        if problem is not None:
            raise ConfigError(problem)

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any] | None, base: SamplingParams | None = None
    ) -> SamplingParams:
        """``base`` (or defaults) updated with the fields of ``values`` it carries (``null``: unset);
        it reads no others (``sampling.refusals`` refuses them: call it first)."""
        out = base or cls()
        if not values:
            return out
        changes: dict[str, Any] = {}
        max_tokens = completion_tokens(values)
        if max_tokens is not None:
            changes["max_tokens"] = int(max_tokens)
        for key in _FLOATS:
            if values.get(key) is not None:
                changes[key] = float(values[key])
        for key in _INTS:
            if values.get(key) is not None:
                changes[key] = int(values[key])
        if changes.get("top_k") == -1:
            changes["top_k"] = 0  # vLLM's other spelling of "every token"
        stop = values.get("stop")
        if stop is not None:
            changes["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
        if values.get("stop_token_ids") is not None:
            changes["stop_token_ids"] = tuple(int(t) for t in values["stop_token_ids"])
        if values.get("logit_bias") is not None:
            changes["logit_bias"] = tuple(sorted((int(k), float(v)) for k, v in values["logit_bias"].items()))
        if values.get("ignore_eos") is not None:
            changes["ignore_eos"] = bool(values["ignore_eos"])
        if values.get("reasoning_effort") is not None:
            changes["reasoning_effort"] = str(values["reasoning_effort"])
        if values.get("chat_template_kwargs") is not None:
            changes["chat_template_kwargs"] = TemplateKwargs.of(values["chat_template_kwargs"])
        logprobs = values.get("logprobs")
        if isinstance(logprobs, bool):
            changes["logprobs"] = logprobs
        elif isinstance(logprobs, int):  # the completions API's form: that many alternatives per token
            changes["logprobs"], changes["top_logprobs"] = True, logprobs
        try:
            constraint = read_structured(values)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if constraint is not None:  # response_format text asks for none: the base's stays
            changes["structured_outputs"] = constraint
        changes.update(tool_changes(values, out.tools))
        return replace(out, **changes)

    def changed(self) -> dict[str, Any]:
        """The fields at values other than their defaults (what an engine must honour), as JSON."""
        out = {}
        for name in _DEFAULTS:
            value = getattr(self, name)
            if value != _DEFAULTS[name]:
                out[name] = _as_json(name, value)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The five fields every job sets, and the others where they are not at their defaults: a
        new field never changes the description (and so the job ids) of jobs that leave it alone."""
        shown = {name: _as_json(name, getattr(self, name)) for name in _ALWAYS_SHOWN}
        return {**shown, **self.changed()}


def _as_json(name: str, value: Any) -> Any:
    if name == "logit_bias":
        return {str(token): bias for token, bias in value}
    if isinstance(value, StructuredOutput | TemplateKwargs | NamedTool):
        return value.as_json()
    if name == "tools":
        return [t.as_json() for t in value]
    return list(value) if isinstance(value, tuple) else value


_DEFAULTS: dict[str, Any] = {name: f.default for name, f in SamplingParams.__dataclass_fields__.items()}


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt: raw ``prompt`` text, or chat ``messages`` rendered by the model's chat template.

    ``metadata`` travels with the request (record id, attempt, role) for engines that use it.
    """

    request_id: str
    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    adapter: Adapter | None = None  # the LoRA adapter that answers (None: the base model)
    # its messages' image parts, loaded by the worker (engines.images.load_images), in order
    images: tuple[image_parts.LoadedImage, ...] = ()

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ConfigError(f"request {self.request_id}: pass exactly one of prompt or messages")

    def prompt_chars(self) -> int:
        """The prompt's characters (of chat messages: their text, image parts left out, and the
        offered tools', which the chat template renders)."""
        if self.prompt is not None:
            return len(self.prompt)
        tools = sum(len(t.spec) for t in self.sampling.tools)
        return tools + image_parts.text_chars(self.messages)

    def estimate_tokens(self) -> int:
        """Prompt tokens (``chars // 4 + 1``, the offered tools' too, and each image's:
        ``engines.images``) plus the completion budget of each of its ``n`` candidates: what the
        request occupies in the engine's KV cache, which is what a batch should be sized by (the
        candidates share the prompt's cache)."""
        if self.prompt is not None:
            prompt = len(self.prompt) // 4 + 1
        else:
            tools = sum(len(t.spec) for t in self.sampling.tools)  # the chat template renders them too
            prompt = tools // 4 + image_parts.estimate_prompt_tokens(self.messages, self.images)
        return prompt + self.sampling.n * self.sampling.max_tokens


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability and its ``top`` alternatives ``(token, logprob)``,
    likeliest first (``SamplingParams.top_logprobs`` of them): OpenAI's ``logprobs.content[*]``."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    def as_json(self) -> dict[str, Any]:
        """OpenAI's chat form: ``{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}``."""
        return {
            "token": self.token,
            "logprob": self.logprob,
            "bytes": list(self.token.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in self.top],
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> TokenLogprob:
        top = tuple((str(t["token"]), float(t["logprob"])) for t in value.get("top_logprobs") or ())
        return cls(str(value["token"]), float(value["logprob"]), top)


@dataclass(frozen=True)
class Choice:
    """One candidate of a request (``n`` > 1: several, in the order the engine gave them)."""

    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None  # None: not asked for
    # a reasoning model's (engines.reasoning): ``text`` is the answer alone
    reasoning: str | None = None  # None: no reasoning parsed
    reasoning_tokens: int = 0
    reasoning_ended: bool = True  # False: the output stopped while still thinking
    tool_calls: tuple[ToolCall, ...] | None = None  # None: the answer made no call (engines.tools)


@dataclass(frozen=True)
class GenerationResult:
    """A request's answer: its first candidate's ``text``, ``finish_reason``, ``logprobs`` and
    ``tool_calls``, its reasoning (``reasoning``, ``reasoning_tokens``, ``reasoning_ended``), and
    with ``n`` > 1 every candidate in ``choices`` (the first included; ``completion_tokens`` is
    theirs together). :attr:`candidates` reads both the same way."""

    text: str | None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # stop | length | tool_calls | error
    logprobs: tuple[TokenLogprob, ...] | None = None
    choices: tuple[Choice, ...] = ()
    reasoning: str | None = None  # the first candidate's, as Choice's
    reasoning_tokens: int = 0
    reasoning_ended: bool = True
    tool_calls: tuple[ToolCall, ...] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def candidates(self) -> tuple[Choice, ...]:
        """Every candidate (one for ``n`` = 1); none for a failed request."""
        if self.choices:
            return self.choices
        if self.text is None:
            return ()
        return (
            Choice(
                self.text,
                self.finish_reason,
                self.completion_tokens,
                self.logprobs,
                self.reasoning,
                self.reasoning_tokens,
                self.reasoning_ended,
                self.tool_calls,
            ),
        )

    @classmethod
    def of(cls, choices: Sequence[Choice], prompt_tokens: int) -> GenerationResult:
        """The result of ``choices`` (at least one): the first's text, all their tokens."""
        first = choices[0]
        return cls(
            first.text,
            None,
            prompt_tokens,
            sum(c.completion_tokens for c in choices),
            first.finish_reason,
            first.logprobs,
            tuple(choices) if len(choices) > 1 else (),
            first.reasoning,
            first.reasoning_tokens,
            first.reasoning_ended,
            first.tool_calls,
        )

    @classmethod
    def failed(cls, error: str) -> GenerationResult:
        return cls(text=None, error=error, finish_reason="error")


@dataclass(frozen=True)
class SecretOption:
    """An engine option that is a credential. It never travels as an argument, a DAG param or in a
    pool's state, which others can read (argv, the Deployment, ``pool.json``): a Kubernetes pool's
    worker gets it as the variable ``env`` from the key ``name`` of its ``engine_secret``; a local
    pool reads ``env`` where it starts and hands it to its workers in a 0600 file
    (``--engine-secrets-file``).

    :param env: the variable the engine reads it from when not given.
    :param required: a Kubernetes ``engine_secret`` must hold the key (the pod does not start without).
    :param is_json: the value is JSON (an object of headers), not text.
    """

    name: str
    env: str
    required: bool = False
    is_json: bool = False


class Engine(abc.ABC):
    """Start once, generate many batches, close once. One instance serves all jobs of a worker."""

    name: ClassVar[str] = "engine"
    # The options that are credentials (see SecretOption); none for engines that take none.
    secret_options: ClassVar[tuple[SecretOption, ...]] = ()
    # The EngineStats fields stats() fills (the docs say which engine's /metrics shows what).
    stats_fields: ClassVar[tuple[str, ...]] = ()
    # Whether it answers with LoRA adapters (given its options: adapter_refusal says when not).
    loads_adapters: ClassVar[bool] = False
    # The scoring model it serves, once started (engines.scoring); None: it generates.
    scoring: ScoringModel | None = None
    # The embedding model it serves, once started (engines.pooling); None: it embeds nothing.
    embedding: EmbeddingModel | None = None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load the model (called once, before the worker reports ready)."""

    @abc.abstractmethod
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One result per request, in order; per-element failures are error results."""

    async def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        """One result per request, in order: the raw outputs of :attr:`scoring`'s labels. An engine
        that serves no scoring model fails each request, saying so."""
        refused = ScoreResult.failed(
            f"the {self.name} engine serves no scoring model: score on a pool whose model is a "
            "sequence-classification or reward model (transformers or vllm)"
        )
        return [refused for _ in requests]

    async def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        """One vector per request, in order (:attr:`embedding`'s). An engine that serves no
        embedding model fails each request, saying so."""
        refused = EmbedResult.failed(
            f"the {self.name} engine serves no embedding model: embed on a pool whose model is an "
            "embedding model (vllm's pooling runner with the embed task, or a transformers encoder)"
        )
        return [refused for _ in requests]

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model."""

    def sleep_refusal(self, level: int) -> str | None:
        """Why this engine, on its device, cannot sleep at ``level`` (the reason and the remedy);
        ``None``: it can. Level 1 frees the device keeping the weights in CPU memory, level 2 drops
        them (a wake reloads them). An engine that does not override it cannot sleep."""
        return (
            f"the {self.name} engine cannot free its device: use gate_idle keep or release (sleep needs "
            "a vllm engine with the engine option enable_sleep_mode, or transformers, on a CUDA GPU)"
        )

    async def sleep(self, level: int) -> None:
        """Free the device at ``level`` (see :meth:`sleep_refusal`, which callers ask first; a refused
        level raises :class:`~airflow_batchinfer.exceptions.ConfigError` with it). The worker calls
        it with no batch in the engine, and wakes the engine before the next batch."""
        raise ConfigError(self.sleep_refusal(level) or f"the {self.name} engine does not sleep")

    async def wake(self) -> None:  # noqa: B027 - only an engine that sleeps has anything to do
        """Take the device back after :meth:`sleep`: the engine serves again when it returns."""

    def estimate_tokens(self, request: GenerationRequest) -> int:
        return request.estimate_tokens()

    @classmethod
    def honours(cls) -> frozenset[str]:
        """The request fields this engine honours: the one description's (``sampling.REQUEST_FIELDS``)."""
        return honoured(cls.name)

    def sampling_refusal(self, sampling: SamplingParams) -> str | None:
        """Why this engine cannot run ``sampling`` (a field it does not honour, named); ``None``: it can."""
        return engine_refusal(sampling.changed(), self.name)

    def adapter_refusal(self) -> str | None:
        """Why this engine cannot answer with LoRA adapters (``None``: it can). A job naming adapters
        is refused at submit with it."""
        if self.loads_adapters:
            return None
        return (
            f"the {self.name} engine does not load LoRA adapters: run them on a vllm pool (engine option "
            "enable_lora) or a transformers pool"
        )

    def describe(self) -> dict[str, Any]:
        """What identifies this engine's outputs (goes into job fingerprints and manifests)."""
        return {"engine": self.name}

    def stats(self) -> EngineStats | None:
        """The engine's own figures now (``None``: it keeps none). Called on the event loop, about
        once a second while jobs run and on each ``/metrics`` scrape: it must be cheap."""
        return None
