"""The ``batchinfer_pool`` connection type and how operators and triggers find a worker pool.

A DAG names its pool with one string, ``worker_pool``:

- ``local://NAME``: the local pool ``NAME`` on the Airflow host (the embedded default; started by
  the pool setup task or ``batchinfer pool up --name NAME``);
- anything else: the id of an Airflow connection of type ``batchinfer_pool`` whose host field lists
  the worker URLs (comma-separated) and whose password is the RPC token, or whose ``backend`` extra
  is ``local`` with ``local_pool`` naming a local pool.

The token never leaves the connection (or the local pool's 0600 token file): it is not in XCom,
task arguments or trigger arguments; triggers resolve it themselves in the triggerer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseHook

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools import LocalPool, StaticPool
from airflow_batchinfer.rpc.pool import PoolClient

LOCAL = "local://"


@dataclass(frozen=True)
class PoolEndpoints:
    urls: list[str]
    token: str | None

    name: str = ""

    def require(self) -> PoolEndpoints:
        """``self``, or a :class:`ConfigError` with the remedy when no worker is live."""
        if not self.urls:
            raise ConfigError(
                f"worker pool {self.name!r} has no live workers: run the DAG's pool setup task "
                "(or `batchinfer pool up`), or check the connection's worker URLs"
            )
        return self

    def client(self, **kwargs: Any) -> PoolClient:
        return PoolClient(self.require().urls, token=self.token, **kwargs)


def _local(name: str) -> PoolEndpoints:
    pool = LocalPool(name)
    return PoolEndpoints(pool.urls(), pool.token, LOCAL + name)


def _from_connection(conn: Any) -> PoolEndpoints:
    extra = conn.extra_dejson
    if extra.get("backend") == "local":
        if not extra.get("local_pool"):
            raise ConfigError(f"connection {conn.conn_id!r}: the local backend needs extra.local_pool")
        return _local(str(extra["local_pool"]))
    urls = [u.strip() for u in (conn.host or "").split(",") if u.strip()]
    static = StaticPool(urls=urls, token=conn.password or None)
    return PoolEndpoints(static.urls, static.token, conn.conn_id)


def pool_endpoints(worker_pool: str) -> PoolEndpoints:
    """Worker URLs and token for ``worker_pool`` (in a task)."""
    if worker_pool.startswith(LOCAL):
        return _local(worker_pool[len(LOCAL) :])
    return _from_connection(BaseHook.get_connection(worker_pool))


async def apool_endpoints(worker_pool: str) -> PoolEndpoints:
    """Worker URLs and token for ``worker_pool`` (in a trigger, on the triggerer's event loop)."""
    if worker_pool.startswith(LOCAL):
        return _local(worker_pool[len(LOCAL) :])
    return _from_connection(await BaseHook.aget_connection(worker_pool))


class BatchInferPoolHook(BaseHook):
    """Hook over a ``batchinfer_pool`` connection: ``get_conn()`` returns the pool's RPC client."""

    conn_name_attr = "batchinfer_pool_conn_id"
    default_conn_name = "batchinfer_pool_default"
    conn_type = "batchinfer_pool"
    hook_name = "Batch Inference worker pool"

    def __init__(self, batchinfer_pool_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batchinfer_pool_conn_id = batchinfer_pool_conn_id

    def endpoints(self) -> PoolEndpoints:
        return pool_endpoints(self.batchinfer_pool_conn_id)

    def get_conn(self) -> PoolClient:
        return self.endpoints().client()

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: every worker must answer ``/v1/ready`` with the token."""
        from airflow_batchinfer.rpc.client import SyncWorkerClient

        try:
            ep = self.endpoints()
            for url in ep.urls:
                with SyncWorkerClient(url, token=ep.token, timeout=10) as client:
                    client.stats()  # needs the token, unlike /v1/ready
            return True, f"{len(ep.urls)} workers answer"
        except Exception as exc:
            return False, str(exc)
