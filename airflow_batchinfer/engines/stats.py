"""What an engine says of itself (:meth:`~airflow_batchinfer.engines.base.Engine.stats`): counters
since it started and gauges as of now, each ``None`` where the engine cannot tell. The worker samples
them for ``/metrics`` and each job's manifest (:mod:`airflow_batchinfer.worker.telemetry`).

vLLM reports all of them through its stat loggers; engines without stats of their own keep a
:class:`StatsTally` of what they can see: their results' tokens, their batches, the requests in them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from airflow_batchinfer.engines.base import GenerationResult
    from airflow_batchinfer.engines.scoring import ScoreResult

CounterName = Literal[
    "generation_tokens",
    "prompt_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "preemptions",
    "batches",
]
GaugeName = Literal["running", "waiting", "kv_cache_usage"]
COUNTERS: tuple[CounterName, ...] = get_args(CounterName)
GAUGES: tuple[GaugeName, ...] = get_args(GaugeName)


@dataclass(frozen=True)
class EngineStats:
    """One reading of an engine's figures.

    Counters (totals since the engine started): ``generation_tokens``, ``prompt_tokens``,
    ``prefix_cache_queries`` and ``prefix_cache_hits`` (prompt tokens looked up in the prefix cache,
    and found), ``preemptions`` (requests evicted from the KV cache to be recomputed), ``batches``.
    Gauges (now): ``running`` and ``waiting`` requests, ``kv_cache_usage`` (fraction in use, 0 to 1).
    """

    generation_tokens: int | None = None
    prompt_tokens: int | None = None
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    preemptions: int | None = None
    batches: int | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None

    def counters(self) -> dict[CounterName, int]:
        """The counters the engine reports."""
        return {k: v for k in COUNTERS if (v := getattr(self, k)) is not None}

    def gauges(self) -> dict[GaugeName, float]:
        """The gauges the engine reports."""
        return {k: float(v) for k in GAUGES if (v := getattr(self, k)) is not None}


TALLIED: tuple[str, ...] = ("generation_tokens", "prompt_tokens", "batches", "running")  # a StatsTally's


class StatsTally:
    """The figures of an engine without stats of its own: its results' tokens, its batches and the
    requests in it now. Safe from several threads (engines that generate in one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.batches = 0
        self.running = 0

    @contextmanager
    def batch(self, size: int) -> Iterator[None]:
        """``size`` requests running in the engine for the block; one batch more once it ends (when
        ``size`` is not 0)."""
        with self._lock:
            self.running += size
        try:
            yield
        finally:
            with self._lock:
                self.running -= size
                self.batches += 1 if size else 0

    def count(self, results: Iterable[GenerationResult | ScoreResult]) -> None:
        """Add the tokens of ``results`` (a scored text's are all prompt tokens)."""
        prompt = completion = 0
        for r in results:
            prompt += r.prompt_tokens
            completion += getattr(r, "completion_tokens", 0)
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += completion

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                generation_tokens=self.generation_tokens,
                prompt_tokens=self.prompt_tokens,
                batches=self.batches,
                running=self.running,
            )
