"""Worker pool backends: ``static`` (known URLs), ``local`` (processes on 127.0.0.1) and
``kubernetes`` (a worker Deployment; ``pools.kubernetes``, imported on use: it needs the client).
A ``worker_pool`` string becomes one of them through :class:`PoolRef` and :func:`open_backend`; each
offers the :class:`WorkerPool` interface (endpoints, token, leases, problems) to ``rpc.pool.PoolClient``.

Imported on first use: importing one module of the package (``pools.one_host``, which every Airflow
process reads through the provider info) loads no other."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_batchinfer.pools.backends import open_backend
    from airflow_batchinfer.pools.local import LocalPool, LocalPoolSpec
    from airflow_batchinfer.pools.ref import PoolRef, WorkerPool, require_endpoints
    from airflow_batchinfer.pools.static import StaticPool

_EXPORTS = {
    "backends": ("open_backend",),
    "local": ("LocalPool", "LocalPoolSpec"),
    "ref": ("PoolRef", "WorkerPool", "require_endpoints"),
    "static": ("StaticPool",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "LocalPool",
    "LocalPoolSpec",
    "PoolRef",
    "StaticPool",
    "WorkerPool",
    "open_backend",
    "require_endpoints",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
