"""What a Kubernetes pool's ``starts()`` observes: its pods as the API serves them, and the model-load
mark each pod's worker reports on ``/v1/stats`` (``started["engine"]``); turned into rows by
:func:`~airflow_batchinfer.pools.starts.pod_starts`."""

from __future__ import annotations

import contextlib
from typing import Any

from airflow_batchinfer.pools.starts import pod_starts, unix_time
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.rpc.urls import http_url
from airflow_batchinfer.state.docs.usage import WorkerStart


def observed_starts(
    api: Any, pods: list[Any], port: int, token: str | None, since: float
) -> list[WorkerStart]:
    """The starts of ``pods`` (the client's models) created since ``since``. A worker that does not
    answer (still starting, or gone) has no ``loaded_s``: the rows are best effort, never an error."""
    docs = [api.sanitize_for_serialization(p) for p in pods]
    loaded: dict[str, float] = {}
    for doc in docs:
        created = unix_time(doc.get("metadata", {}).get("creationTimestamp"))
        ip = (doc.get("status") or {}).get("podIP")
        if created is None or created + 1 <= since or not ip:
            continue
        with (
            contextlib.suppress(Exception),
            SyncWorkerClient(http_url(ip, port), token=token, timeout=5) as c,
        ):
            if (at := c.stats().started.get("engine")) is not None:
                loaded[doc["metadata"]["name"]] = at
    return pod_starts(docs, since, loaded)
