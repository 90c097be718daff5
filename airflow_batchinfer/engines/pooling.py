"""Pooling tasks: what a run does with its records besides generating (the run setting ``task``).

- ``embed``: a vector per text, from an embedding model (:class:`EmbeddingModel`; an engine serves
  one in :attr:`Engine.embedding <airflow_batchinfer.engines.base.Engine.embedding>` and answers
  :meth:`Engine.embed <airflow_batchinfer.engines.base.Engine.embed>`), L2-normalized as vLLM's
  server does by default;
- ``classify``: a sequence-classification model's labels with their probabilities and the likeliest
  label (:func:`classify`, read from the raw outputs of :meth:`Engine.score`, as the judges read them);
- ``score``: those raw outputs as they are (a reward model's score).

A row carries its vector compactly (:func:`encode_vector`): the base64 of its little-endian float32
values, with ``embedding_dtype`` and ``dimensions`` beside it, which a JSONL and a Parquet file
store alike (4 bytes a value, not the ~20 of a JSON number); :func:`decode_vector` reads it back.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.engines.messages import flat_text
from airflow_batchinfer.engines.scoring import ScoringModel, label_probability
from airflow_batchinfer.exceptions import ConfigError

GENERATE = "generate"
# the run's task: generate (a model's answers), or one of the pooling tasks
TASKS = (GENERATE, "embed", "classify", "score")
POOLING_TASKS = TASKS[1:]
# what a row's vector is stored as (encode_vector): the base64 of these little-endian values
EMBEDDING_DTYPE = "float32"


def check_task(task: Any, what: str = "task") -> str:
    """``task`` if it is one of :data:`TASKS`, else a ConfigError naming them."""
    if task not in TASKS:
        raise ConfigError(f"{what} must be one of {', '.join(TASKS)}, got {task!r}")
    return str(task)


@dataclass(frozen=True)
class EmbeddingModel:
    """The embedding model a worker serves.

    :ivar path: its directory on the worker.
    :ivar dimensions: the length of its vectors.
    :ivar matryoshka: trained so that a vector's first values are a shorter one (its config's
        ``matryoshka_dimensions`` or ``is_matryoshka``): only then may a request ask for fewer
        ``dimensions`` (as vLLM decides).
    """

    path: str
    dimensions: int
    matryoshka: bool = False

    def describe(self) -> dict[str, Any]:
        """What a worker's engine description adds for it (``/v1/stats``, job manifests)."""
        return {"task": "embed", "dimensions": self.dimensions}


@dataclass(frozen=True)
class EmbedRequest:
    """One text to embed: raw ``prompt`` text, or chat ``messages`` rendered by the model's chat
    template; ``dimensions``: the vector's first that many values (a Matryoshka model's shorter
    vector), normalized again; ``None``: all of them."""

    request_id: str
    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    dimensions: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ConfigError(f"embed request {self.request_id}: pass exactly one of prompt or messages")
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or self.dimensions < 1):
            raise ConfigError(
                f"embed request {self.request_id}: dimensions must be >= 1, got {self.dimensions}"
            )

    def text(self) -> str:
        """The prompt, or the messages' contents one a line (what an engine without a chat template
        embeds, and what the simulated engine hashes)."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(flat_text(m.get("content")) for m in self.messages or ())

    def estimate_tokens(self) -> int:
        """Its tokens (``chars // 4 + 1``): no completion budget, a text is read once."""
        return len(self.text()) // 4 + 1


@dataclass(frozen=True)
class EmbedResult:
    """An embed request's vector (``error`` set instead when it failed)."""

    vector: tuple[float, ...] | None
    error: str | None = None
    prompt_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failed(cls, error: str) -> EmbedResult:
        return cls(None, error)


def shaped(vector: Sequence[float], dimensions: int | None, *, normalize: bool = True) -> tuple[float, ...]:
    """``vector``'s first ``dimensions`` values (all: ``None``), divided by their L2 norm when
    ``normalize`` (a zero vector stays zero), as vLLM's embed pooler does."""
    values = [float(v) for v in (vector if dimensions is None else vector[:dimensions])]
    if not normalize:
        return tuple(values)
    norm = math.sqrt(sum(v * v for v in values))
    return tuple(v / norm for v in values) if norm > 0 else tuple(values)


def dimensions_refusal(request: EmbedRequest, model: EmbeddingModel) -> str | None:
    """Why ``model`` cannot give ``request`` its ``dimensions`` (not a Matryoshka model, or more than
    the model's); ``None``: it can."""
    if request.dimensions is not None and not model.matryoshka:
        return (
            f"dimensions {request.dimensions}: {os.path.basename(model.path)} is no Matryoshka model (its "
            "config names no matryoshka_dimensions), so its vectors cannot be shortened: leave dimensions out"
        )
    if request.dimensions is not None and request.dimensions > model.dimensions:
        return (
            f"dimensions {request.dimensions} is more than the model's {model.dimensions}: ask for at "
            f"most {model.dimensions}, or leave dimensions out"
        )
    return None


def is_matryoshka(config: Any) -> bool:
    """Whether a transformers config says its model is a Matryoshka one (vLLM's test)."""
    return bool(getattr(config, "matryoshka_dimensions", None)) or bool(
        getattr(config, "is_matryoshka", False)
    )


def simulated_vector(text: str, dimensions: int) -> tuple[float, ...]:
    """A deterministic, normalized vector for ``text`` (the simulated engine's: no model ran)."""
    digest = b""
    counter = 0
    while len(digest) < 4 * dimensions:
        digest += hashlib.sha256(f"{counter}\x1f{text}".encode()).digest()
        counter += 1
    raw = [int.from_bytes(digest[4 * i : 4 * i + 4], "little") / 2**32 - 0.5 for i in range(dimensions)]
    return shaped(raw, None)


def encode_vector(vector: Sequence[float]) -> str:
    """``vector`` as a row carries it: the base64 of its little-endian float32 values (OpenAI's
    ``encoding_format: base64`` form too)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def decode_vector(text: str) -> list[float]:
    """A vector :func:`encode_vector` wrote."""
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def task_refusal(task: str, scoring: ScoringModel | None, embedding: EmbeddingModel | None) -> str | None:
    """Why a worker serving ``scoring`` or ``embedding`` (neither: a generating model) cannot run an
    infer job of ``task``; ``None``: it can."""
    if task == "embed" and embedding is None:
        return (
            "task embed needs an embedding model, and this worker's model is not one: start the pool with "
            'an embedding model (vllm: a pooling model with the embed task, e.g. engine options {"runner": '
            '"pooling", "convert": "embed"}; transformers: an encoder, a sentence-transformers directory)'
        )
    if task in ("classify", "score") and scoring is None:
        return (
            f"task {task} needs a sequence-classification or reward model, and this worker's model is not "
            'one: start the pool with one (vllm: engine options {"runner": "pooling", "convert": "classify"} '
            "turn a causal LM into one)"
        )
    if task == GENERATE and embedding is not None:
        return (
            f"this worker's model ({os.path.basename(embedding.path)}) is an embedding model: it generates "
            "nothing: set task embed, or run on a pool whose model generates"
        )
    return None


def served_refusal(task: str, described: Mapping[str, Any]) -> str | None:
    """Why the run's pool, whose engine ``described`` itself (``task``: ``score`` for a scoring model,
    ``embed`` for an embedding one, none for a generating one), cannot run a run of ``task``."""
    served = described.get("task")
    needed = {"embed": "embed", "classify": "score", "score": "score"}.get(task)
    if served == needed:
        return None
    model = described.get("model")
    if task == GENERATE:
        what = "a scoring model" if served == "score" else "an embedding model"
        return (
            f"the run's pool serves {what} ({model}), which generates nothing: give worker_pool a "
            "generating model (a scoring model goes to the judge pool), or set the run's task"
        )
    wanted = "an embedding model" if task == "embed" else "a sequence-classification or reward model"
    return f"task {task} needs {wanted} on the run's pool, and its model ({model}) is not: start it with one"


def classify(logits: Sequence[float], model: ScoringModel) -> tuple[str, dict[str, float]]:
    """The likeliest label and each label's probability, from a classifier's raw outputs: a softmax
    over them, or each output's sigmoid for a single-output head or a multi-label model
    (:func:`~airflow_batchinfer.engines.scoring.label_probability`)."""
    if len(logits) != len(model.labels):
        raise ValueError(f"{len(logits)} outputs for the model's {len(model.labels)} labels")
    probs = {
        label: label_probability(logits, i, multi_label=model.multi_label)
        for i, label in enumerate(model.labels)
    }
    best = max(range(len(logits)), key=lambda i: logits[i])
    return model.labels[best], probs
