"""Worker pool backends: ``static`` (known URLs), ``local`` (processes on 127.0.0.1) and
``kubernetes`` (a worker Deployment; ``pools.kubernetes``, imported on use: it needs the client).
Each yields worker URLs and a token for ``rpc.pool.PoolClient``."""

from __future__ import annotations

from airflow_batchinfer.pools.local import LocalPool, LocalPoolSpec
from airflow_batchinfer.pools.static import StaticPool

__all__ = ["LocalPool", "LocalPoolSpec", "StaticPool"]
