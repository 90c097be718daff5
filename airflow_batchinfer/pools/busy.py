"""Whether a worker runs a job, as its ``/v1/stats`` says: what a pool asks before it stops or ranks
workers for a scale-down (:mod:`~airflow_batchinfer.pools.tail`), the same way on every backend."""

from __future__ import annotations

from airflow_batchinfer.rpc.client import SyncWorkerClient

ASK_TIMEOUT_S = 5.0


def worker_busy(url: str, token: str | None) -> bool | None:
    """``True`` when the worker at ``url`` runs (or is draining) a job, ``False`` when idle, ``None``
    when it cannot be asked (starting, gone, refusing): the caller keeps such a worker as it is."""
    try:
        with SyncWorkerClient(url, token=token, timeout=ASK_TIMEOUT_S) as client:
            stats = client.stats()
    except Exception:  # not answering: not ours to judge
        return None
    return stats.slots_busy > 0 or stats.draining
