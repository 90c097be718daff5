"""``GET /metrics``: Prometheus text exposition, written by hand (no client library needed)."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_batchinfer.worker.registry import JobRegistry

Samples = list[tuple[float, dict[str, str] | None]]


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
    return "\n".join(out) + "\n"
