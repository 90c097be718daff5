"""``TokenBatcher`` and ``Prompt``: the batcher with costs counted in tokens."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airflow_batchinfer.batching.batcher import CostEstimator, DynamicBatcher, ProcessFn

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Prompt:
    """A text prompt; ``estimate_tokens()`` is the cheap ``len(text) // 4 + 1`` heuristic."""

    text: str
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    def estimate_tokens(self) -> int:
        return len(self.text) // 4 + 1


class TokenBatcher(DynamicBatcher[T, R]):
    """A :class:`DynamicBatcher` whose cost is tokens.

    Cost per record: explicit ``estimated_tokens`` (or ``estimated_cost``) > ``token_estimator(record)``
    > ``record.estimate_tokens()`` > ``record.estimate_cost()`` > ``default_token_estimate``.

    :param inference_fn: the batch function (``process_fn`` is accepted as an alias).
    :param target_batch_tokens: tokens per batch (default 32,000).
    :param default_token_estimate: tokens of a record nothing else estimates (default 1).

    Other keyword arguments are those of :class:`DynamicBatcher`.
    """

    def __init__(
        self,
        inference_fn: ProcessFn[T, R] | None = None,
        *,
        process_fn: ProcessFn[T, R] | None = None,
        token_estimator: CostEstimator[T] | None = None,
        target_batch_tokens: float | None = None,
        default_token_estimate: float | None = None,
        **kwargs: Any,
    ) -> None:
        if (inference_fn is None) == (process_fn is None):
            raise ValueError("pass exactly one of inference_fn or process_fn")
        fn = inference_fn if inference_fn is not None else process_fn
        assert fn is not None
        if token_estimator is not None:
            kwargs["cost_estimator"] = token_estimator
        if target_batch_tokens is not None:
            kwargs["target_batch_cost"] = target_batch_tokens
        if default_token_estimate is not None:
            kwargs["default_cost"] = default_token_estimate
        super().__init__(fn, **kwargs)

    @property
    def target_batch_tokens(self) -> float:
        return self.target_batch_cost

    async def submit(
        self, record: T, *, estimated_tokens: float | None = None, estimated_cost: float | None = None
    ) -> asyncio.Future[R]:
        """Queue one record; ``estimated_tokens`` wins over ``estimated_cost``."""
        explicit = estimated_tokens if estimated_tokens is not None else estimated_cost
        return await super().submit(record, estimated_cost=explicit)

    def _intrinsic_cost(self, record: T) -> float:
        estimate = getattr(record, "estimate_tokens", None)
        return float(estimate()) if callable(estimate) else super()._intrinsic_cost(record)
