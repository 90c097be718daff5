"""The ``batchinfer_pool`` connection type, and how tasks and triggers open the pool a DAG names.

``worker_pool`` is parsed once into a :class:`~airflow_batchinfer.pools.ref.PoolRef` (see there for
the forms it takes) and opened by :func:`~airflow_batchinfer.pools.backends.open_backend`; this module
only supplies what needs Airflow: the connection a reference names and, for ``kubernetes_conn_id``,
the cncf.kubernetes provider's API client.

The token never leaves the connection, the local pool's 0600 token file or the Kubernetes Secret: it
is not in XCom, task arguments or trigger arguments; triggers resolve it themselves in the triggerer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airflow.sdk import BaseHook

from airflow_batchinfer.pools.backends import open_backend
from airflow_batchinfer.pools.ref import PoolRef, WorkerPool, require_endpoints
from airflow_batchinfer.rpc.pool import PoolClient


def _kubernetes_api(conn_id: str | None) -> Any:
    if conn_id is None:
        from airflow_batchinfer.pools.kubernetes import api_client

        return api_client()
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=conn_id).get_conn()


def open_pool(worker_pool: str | PoolRef) -> WorkerPool:
    """The pool ``worker_pool`` names (in a task)."""
    ref = worker_pool if isinstance(worker_pool, PoolRef) else PoolRef.parse(worker_pool)
    conn = BaseHook.get_connection(ref.name) if ref.needs_connection else None
    return open_backend(ref, conn, kubernetes_api=_kubernetes_api)


async def aopen_pool(worker_pool: str | PoolRef) -> WorkerPool:
    """The pool ``worker_pool`` names (in a trigger, on the triggerer's event loop). Its methods
    may block (the Kubernetes client is synchronous): call them with ``asyncio.to_thread``."""
    ref = worker_pool if isinstance(worker_pool, PoolRef) else PoolRef.parse(worker_pool)
    conn = await BaseHook.aget_connection(ref.name) if ref.needs_connection else None
    return await asyncio.to_thread(open_backend, ref, conn, kubernetes_api=_kubernetes_api)


class BatchInferPoolHook(BaseHook):
    """Hook over a ``batchinfer_pool`` connection: ``get_conn()`` returns the pool's RPC client."""

    conn_name_attr = "batchinfer_pool_conn_id"
    default_conn_name = "batchinfer_pool_default"
    conn_type = "batchinfer_pool"
    hook_name = "Batch Inference worker pool"

    def __init__(self, batchinfer_pool_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batchinfer_pool_conn_id = batchinfer_pool_conn_id

    def pool(self) -> WorkerPool:
        return open_pool(self.batchinfer_pool_conn_id)

    def get_conn(self) -> PoolClient:
        return PoolClient.for_pool(self.pool())

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: every worker must answer ``/v1/stats`` with the token."""
        from airflow_batchinfer.rpc.client import SyncWorkerClient

        try:
            pool = self.pool()
            urls = require_endpoints(pool)
            for url in urls:
                with SyncWorkerClient(url, token=pool.token(), timeout=10) as client:
                    client.stats()  # needs the token, unlike /v1/ready
            return True, f"{len(urls)} workers answer"
        except Exception as exc:
            return False, str(exc)
