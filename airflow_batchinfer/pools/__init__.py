"""Worker pool backends: ``static`` (known URLs), ``local`` (processes on 127.0.0.1) and
``kubernetes`` (a worker Deployment; ``pools.kubernetes``, imported on use: it needs the client).
A ``worker_pool`` string becomes one of them through :class:`PoolRef` and :func:`open_backend`; each
offers the :class:`WorkerPool` interface (endpoints, token, leases, problems) to ``rpc.pool.PoolClient``.

Imported on first use: importing one module of the package (``pools.one_host``, which every Airflow
process reads through the provider info) loads no other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
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

# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "backends": ("open_backend",),
        "local": ("LocalPool", "LocalPoolSpec"),
        "ref": ("PoolRef", "WorkerPool", "require_endpoints"),
        "static": ("StaticPool",),
    },
)
