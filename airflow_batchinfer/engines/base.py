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

from airflow_batchinfer.engines.sampling import bounds_refusal
from airflow_batchinfer.engines.stats import EngineStats
from airflow_batchinfer.exceptions import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; ``from_mapping`` also reads an OpenAI request body's fields. The bounds
    are :data:`~airflow_batchinfer.engines.sampling.SAMPLING_FIELDS`'s."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_tokens", "temperature", "top_p"):
            refusal = bounds_refusal(name, getattr(self, name))
            if refusal is not None:
                raise ConfigError(refusal)

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any] | None, base: SamplingParams | None = None
    ) -> SamplingParams:
        """``base`` (or defaults) updated with the known fields of ``values``; others are ignored."""
        out = base or cls()
        if not values:
            return out
        changes: dict[str, Any] = {}
        max_tokens = values.get("max_completion_tokens", values.get("max_tokens"))
        if max_tokens is not None:
            changes["max_tokens"] = int(max_tokens)
        for key in ("temperature", "top_p"):
            if values.get(key) is not None:
                changes[key] = float(values[key])
        if values.get("seed") is not None:
            changes["seed"] = int(values["seed"])
        stop = values.get("stop")
        if stop is not None:
            changes["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
        return replace(out, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": list(self.stop),
        }


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

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ConfigError(f"request {self.request_id}: pass exactly one of prompt or messages")

    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(str(m.get("content", ""))) for m in self.messages or ())

    def estimate_tokens(self) -> int:
        """Prompt tokens (``chars // 4 + 1``) plus the completion budget: what the request occupies
        in the engine's KV cache, which is what a batch should be sized by."""
        return self.prompt_chars() // 4 + 1 + self.sampling.max_tokens


@dataclass(frozen=True)
class GenerationResult:
    text: str | None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # stop | length | error

    @property
    def ok(self) -> bool:
        return self.error is None

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

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load the model (called once, before the worker reports ready)."""

    @abc.abstractmethod
    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One result per request, in order; per-element failures are error results."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model."""

    def estimate_tokens(self, request: GenerationRequest) -> int:
        return request.estimate_tokens()

    def describe(self) -> dict[str, Any]:
        """What identifies this engine's outputs (goes into job fingerprints and manifests)."""
        return {"engine": self.name}

    def stats(self) -> EngineStats | None:
        """The engine's own figures now (``None``: it keeps none). Called on the event loop, about
        once a second while jobs run and on each ``/metrics`` scrape: it must be cheap."""
        return None
