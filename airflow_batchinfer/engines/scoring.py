"""Scoring: the engine capability beside generation that ``reward`` and ``classifier`` judges use.

A scoring model is a sequence-classification (or reward) model: a text in, one raw output (a logit)
per label out. A worker whose model is one scores instead of generating: the engine finds out
when it loads the model (transformers: a ``*ForSequenceClassification`` architecture; vLLM: its
pooling runner with the ``classify`` task) and says so in :attr:`Engine.scoring
<airflow_batchinfer.engines.base.Engine.scoring>`. Score requests go through the worker's shared
batcher like generation requests, so judge jobs batch the same way.

Engines return the raw outputs; what they mean is decided here, once, for every engine: a
classifier's P(label) is the softmax over the labels, or the sigmoid of the label's own output for
a single-output head or a multi-label model (:func:`label_probability`); a reward model's score is
the raw output itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.engines.messages import flat_text
from airflow_batchinfer.exceptions import ConfigError

# The architectures the transformers engine loads as scoring models (vLLM decides by its own registry).
SCORING_SUFFIXES = ("ForSequenceClassification",)
# Label names read as "the answer is good" when a classifier judge names no label (lower case).
POSITIVE_LABELS = ("approved", "positive", "good", "yes", "true", "correct", "acceptable", "pass", "safe")


@dataclass(frozen=True)
class ScoringModel:
    """The scoring model a worker serves.

    :ivar path: its directory on the worker (what a judge's ``model`` is compared with).
    :ivar labels: its labels in output order (``id2label``); one for a single-output (reward) head.
    :ivar multi_label: each label's probability is the sigmoid of its own output (a multi-label
        model, ``problem_type: multi_label_classification``), not a softmax over all of them.
    """

    path: str
    labels: tuple[str, ...]
    multi_label: bool = False

    def describe(self) -> dict[str, Any]:
        """What a worker's engine description adds for it (``/v1/stats``, job manifests)."""
        return {"task": "score", "labels": list(self.labels)}

    def label_index(self, label: str | int | None) -> int:
        """The output index of ``label`` (a name or an index; ``None``: :func:`default_label`);
        :class:`ConfigError` naming the labels when the model has no such label."""
        if label is None:
            return default_label(self.labels)
        if isinstance(label, int) and not isinstance(label, bool):
            if 0 <= label < len(self.labels):
                return label
        elif isinstance(label, str):
            for i, name in enumerate(self.labels):
                if name == label:
                    return i
            for i, name in enumerate(self.labels):
                if name.lower() == label.lower():
                    return i
        raise ConfigError(
            f"label {label!r} is not one of this model's labels {list(self.labels)} (by name, or an index "
            f"0..{len(self.labels) - 1}): name one of them"
        )


def default_label(labels: Sequence[str]) -> int:
    """The label a classifier judge reads when it names none: the only one; else the first whose
    name says "good" (:data:`POSITIVE_LABELS`, e.g. ``POSITIVE``); else the last (``LABEL_1`` of a
    binary head, whose ``LABEL_0`` is the negative class)."""
    if len(labels) == 1:
        return 0
    for i, name in enumerate(labels):
        if name.lower() in POSITIVE_LABELS:
            return i
    return len(labels) - 1


def label_probability(logits: Sequence[float], index: int, *, multi_label: bool = False) -> float:
    """P(label ``index``) from a classifier's raw outputs: the sigmoid of its own output for a single
    output or a multi-label model, else the softmax over all outputs (computed stably)."""
    if multi_label or len(logits) == 1:
        x = logits[index]
        return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    return weights[index] / sum(weights)


def is_scoring_architecture(architectures: Sequence[str] | None) -> bool:
    """Whether a model of ``architectures`` (its ``config.json``'s) is one the transformers engine
    loads as a scoring model."""
    return any(a.endswith(SCORING_SUFFIXES) for a in architectures or ())


def labels_of(config: Any) -> tuple[tuple[str, ...], bool]:
    """A transformers config's labels in output order and whether it is multi-label."""
    id2label: Mapping[Any, Any] = getattr(config, "id2label", None) or {}
    count = int(getattr(config, "num_labels", 0) or len(id2label) or 1)
    labels = tuple(str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(count))
    return labels, getattr(config, "problem_type", None) == "multi_label_classification"


@dataclass(frozen=True)
class ScoreRequest:
    """One text to score: raw ``prompt`` text (scored as it is), or chat ``messages`` (a
    conversation ending with the answer's ``assistant`` turn) rendered by the model's chat template."""

    request_id: str
    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ConfigError(f"score request {self.request_id}: pass exactly one of prompt or messages")

    def estimate_tokens(self) -> int:
        """Its tokens (``chars // 4 + 1``): no completion budget, scoring reads the text once."""
        if self.prompt is not None:
            return len(self.prompt) // 4 + 1
        return sum(len(flat_text(m.get("content"))) for m in self.messages or ()) // 4 + 1


@dataclass(frozen=True)
class ScoreResult:
    """A score request's raw outputs, one per label (``error`` set instead when it failed)."""

    logits: tuple[float, ...] | None
    error: str | None = None
    prompt_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failed(cls, error: str) -> ScoreResult:
        return cls(None, error)
