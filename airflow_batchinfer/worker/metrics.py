"""``GET /metrics``: Prometheus text exposition, written by hand (no client library needed).

Besides the worker's own figures, the engine's (:data:`ENGINE_METRICS`, from its
:meth:`~airflow_batchinfer.engines.base.Engine.stats`): only those the engine reports appear.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from airflow_batchinfer.engines import ENGINES, engine_class
from airflow_batchinfer.engines.stats import CounterName, EngineStats, GaugeName
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.telemetry import RATE_WINDOW_S, Telemetry

Samples = list[tuple[float, dict[str, str] | None]]


@dataclass(frozen=True)
class EngineMetric:
    """One engine figure on ``/metrics``: ``source`` is the :class:`EngineStats` field it shows
    (``rate``: that counter per second; ``hit_rate``: prefix-cache hits over queries)."""

    name: str
    kind: Literal["counter", "gauge"]
    source: CounterName | GaugeName
    help: str
    rate: bool = False
    hit_rate: bool = False


ENGINE_METRICS: tuple[EngineMetric, ...] = (
    EngineMetric("batchinfer_engine_generation_tokens_total", "counter", "generation_tokens",
                 "Tokens the engine generated since it started."),
    EngineMetric("batchinfer_engine_prompt_tokens_total", "counter", "prompt_tokens",
                 "Prompt tokens the engine processed since it started (prefix-cache hits included)."),
    EngineMetric("batchinfer_engine_generation_tokens_per_second", "gauge", "generation_tokens",
                 f"Tokens generated per second over the last {RATE_WINDOW_S:g} s of jobs.", rate=True),
    EngineMetric("batchinfer_engine_prompt_tokens_per_second", "gauge", "prompt_tokens",
                 f"Prompt tokens per second over the last {RATE_WINDOW_S:g} s of jobs.", rate=True),
    EngineMetric("batchinfer_engine_prefix_cache_queries_total", "counter", "prefix_cache_queries",
                 "Prompt tokens looked up in the prefix cache."),
    EngineMetric("batchinfer_engine_prefix_cache_hits_total", "counter", "prefix_cache_hits",
                 "Prompt tokens found in the prefix cache."),
    EngineMetric("batchinfer_engine_prefix_cache_hit_rate", "gauge", "prefix_cache_hits",
                 "Prefix-cache hits / queries since the engine started.", hit_rate=True),
    EngineMetric("batchinfer_engine_preemptions_total", "counter", "preemptions",
                 "Requests preempted (evicted from the KV cache, to be recomputed)."),
    EngineMetric("batchinfer_engine_batches_total", "counter", "batches",
                 "Batches the engine ran (engines without continuous batching)."),
    EngineMetric("batchinfer_engine_requests_running", "gauge", "running", "Requests in the engine now."),
    EngineMetric("batchinfer_engine_requests_waiting", "gauge", "waiting",
                 "Requests queued in the engine's scheduler now."),
    EngineMetric("batchinfer_engine_kv_cache_usage", "gauge", "kv_cache_usage",
                 "Fraction of the KV cache in use now (0 to 1)."),
)  # fmt: skip


def engine_reporting() -> dict[str, list[str]]:
    """Per engine metric, the engines whose stats include it (for the docs)."""
    classes = {name: engine_class(name) for name in ENGINES}
    return {m.name: [n for n, cls in classes.items() if m.source in cls.stats_fields] for m in ENGINE_METRICS}


def engine_samples(telemetry: Telemetry) -> list[tuple[EngineMetric, float]]:
    """The engine metrics it reports now, with their values."""
    stats = telemetry.read()
    if stats is None:
        return []
    rates = telemetry.rates()
    out = []
    for m in ENGINE_METRICS:
        value = _engine_value(m, stats, rates)
        if value is not None:
            out.append((m, value))
    return out


def _engine_value(m: EngineMetric, stats: EngineStats, rates: dict[str, float]) -> float | None:
    raw = getattr(stats, m.source)
    if raw is None:
        return None
    if m.rate:
        return round(rates.get(m.source, 0.0), 3)
    if m.hit_rate:
        queries = stats.prefix_cache_queries
        return raw / queries if queries else None
    return float(raw)


def _line(name: str, value: float, labels: dict[str, str] | None = None) -> str:
    if labels:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}} {value}"
    return f"{name} {value}"


def render(registry: JobRegistry) -> str:
    s = registry.runtime.batcher.stats
    out: list[str] = []

    def metric(
        name: str, kind: str, help_: str, samples: Sequence[tuple[float, dict[str, str] | None]]
    ) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(_line(name, v, labels) for v, labels in samples)

    jobs = [
        (float(n), {"kind": k.split(":")[0], "state": k.split(":")[1]})
        for k, n in sorted(registry.totals.items())
    ]
    metric(
        "batchinfer_jobs_finished_total",
        "counter",
        "Shard jobs finished, by kind and state.",
        jobs or [(0.0, None)],
    )
    metric("batchinfer_jobs_running", "gauge", "Shard jobs running now.", [(float(registry.busy), None)])
    busy = 1.0 if registry.busy else 0.0
    metric("batchinfer_worker_busy", "gauge", "1 while a job runs on this worker, else 0.", [(busy, None)])
    sleeping = 1.0 if registry.runtime.sleeper.sleeping else 0.0
    metric(
        "batchinfer_worker_sleeping",
        "gauge",
        "1 while the engine sleeps (its device memory freed: POST /v1/sleep), else 0.",
        [(sleeping, None)],
    )
    metric("batchinfer_slots", "gauge", "Job slots of this worker.", [(float(registry.concurrency), None)])
    records: Samples = [(float(n), {"outcome": k}) for k, n in sorted(registry.records.items())]
    metric(
        "batchinfer_records_total",
        "counter",
        "Records processed by finished jobs, by outcome.",
        records or [(0.0, None)],
    )
    metric(
        "batchinfer_errors_total",
        "counter",
        "Records that ended in an error.",
        [(float(registry.records.get("error", 0)), None)],
    )
    metric("batchinfer_batches_total", "counter", "Engine batches run.", [(float(s.total_batches), None)])
    metric(
        "batchinfer_batch_size_avg", "gauge", "Average records per engine batch.", [(s.avg_batch_size, None)]
    )
    metric(
        "batchinfer_batch_cost_avg", "gauge", "Average tokens per engine batch.", [(s.avg_batch_cost, None)]
    )
    metric("batchinfer_batch_fill_avg", "gauge", "Average batch tokens / target.", [(s.avg_fill, None)])
    metric("batchinfer_engine_utilization", "gauge", "Engine busy / (busy + idle).", [(s.utilization, None)])
    metric(
        "batchinfer_engine_busy_seconds_total",
        "counter",
        "Time the engine was running batches.",
        [(s.busy_time_s, None)],
    )
    metric(
        "batchinfer_queue_depth",
        "gauge",
        "Requests waiting in the batcher queue.",
        [(float(s.queue_depth), None)],
    )
    tokens: Samples = [(float(registry.tokens[k]), {"type": k}) for k in ("completion", "prompt")]
    metric("batchinfer_tokens_total", "counter", "Tokens processed by finished jobs.", tokens)
    for m, value in engine_samples(registry.telemetry):
        metric(m.name, m.kind, m.help, [(value, None)])
    return "\n".join(out) + "\n"
