"""A pool's replicas in the Prometheus text format (``batchinfer pool metrics``): what it runs, what
the runs' leases ask of it and what is busy, for a node-exporter textfile collector or a scrape of
a CronJob's output. Pure: :func:`render_pool_metrics` formats what the caller observed."""

from __future__ import annotations

from collections.abc import Mapping

# name -> help; all gauges, labelled by the pool's reference
METRICS = {
    "batchinfer_pool_replicas": "Workers the pool runs (a Kubernetes pool: its Deployment's replicas).",
    "batchinfer_pool_ready_replicas": "Workers ready for jobs.",
    "batchinfer_pool_leased_replicas": "The most replicas a live lease asks for (0: no run holds it).",
    "batchinfer_pool_leases": "Live leases: runs (and CLI users) holding the pool.",
    "batchinfer_pool_busy_replicas": "Workers whose /v1/stats shows a running job.",
}


def _label(value: str) -> str:
    """A label value, escaped as the text format wants (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_pool_metrics(
    pool: str, *, replicas: int, ready: int, leases: Mapping[str, int], busy: int | None
) -> str:
    """The metrics of ``pool`` (its reference, the ``pool`` label): ``leases`` maps each live lease
    to the replicas it asks for; ``busy``: workers running a job (``None``: none answered, so the
    gauge is left out rather than reported as 0)."""
    values: dict[str, int | None] = {
        "batchinfer_pool_replicas": replicas,
        "batchinfer_pool_ready_replicas": ready,
        "batchinfer_pool_leased_replicas": max(leases.values(), default=0),
        "batchinfer_pool_leases": len(leases),
        "batchinfer_pool_busy_replicas": busy,
    }
    lines = []
    for name, help_ in METRICS.items():
        value = values[name]
        if value is None:
            continue
        lines += [
            f"# HELP {name} {help_}",
            f"# TYPE {name} gauge",
            f'{name}{{pool="{_label(pool)}"}} {value}',
        ]
    return "\n".join(lines) + "\n"
