"""Worker pool backends: ``static`` (known URLs), ``local`` (processes on 127.0.0.1) and
``kubernetes`` (a worker Deployment; ``pools.kubernetes``, imported on use: it needs the client).
A ``worker_pool`` string becomes one of them through :class:`PoolRef` and :func:`open_backend`; each
offers the :class:`WorkerPool` interface (endpoints, token, leases, problems) to ``rpc.pool.PoolClient``."""

from __future__ import annotations

from airflow_batchinfer.pools.backends import open_backend
from airflow_batchinfer.pools.local import LocalPool, LocalPoolSpec
from airflow_batchinfer.pools.ref import PoolRef, WorkerPool, require_endpoints
from airflow_batchinfer.pools.static import StaticPool

__all__ = [
    "LocalPool",
    "LocalPoolSpec",
    "PoolRef",
    "StaticPool",
    "WorkerPool",
    "open_backend",
    "require_endpoints",
]
