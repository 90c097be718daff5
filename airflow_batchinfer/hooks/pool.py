"""The ``batchinfer_pool`` connection type and how operators and triggers find a worker pool.

A DAG names its pool with one string, ``worker_pool``:

- ``local://NAME``: the local pool ``NAME`` on the Airflow host (the embedded default; started by
  the pool setup task or ``batchinfer pool up --name NAME``);
- ``kubernetes://NAMESPACE/NAME``: the Kubernetes pool ``NAME`` (a worker Deployment), reached with
  the in-cluster service account or ``$KUBECONFIG``; ``?kubernetes_conn_id=ID`` uses a
  cncf.kubernetes connection instead;
- anything else: the id of an Airflow connection of type ``batchinfer_pool`` whose host field lists
  the worker URLs (comma-separated) and whose password is the RPC token, or whose ``backend`` extra
  is ``local`` (``local_pool``: the name) or ``kubernetes`` (``namespace``, ``pool`` and optionally
  ``kubernetes_conn_id``).

The token never leaves the connection, the local pool's 0600 token file or the Kubernetes Secret: it
is not in XCom, task arguments or trigger arguments; triggers resolve it themselves in the triggerer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from airflow.sdk import BaseHook

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools import LocalPool, StaticPool
from airflow_batchinfer.rpc.pool import PoolClient

if TYPE_CHECKING:
    from airflow_batchinfer.pools.kubernetes import KubernetesPool

LOCAL = "local://"
KUBERNETES = "kubernetes://"


@dataclass(frozen=True)
class PoolEndpoints:
    urls: list[str]
    token: str | None

    name: str = ""
    discover: Callable[[], list[str]] | None = None  # pools whose workers come and go

    def require(self) -> PoolEndpoints:
        """``self``, or a :class:`ConfigError` with the remedy when no worker is live."""
        if not self.urls:
            raise ConfigError(
                f"worker pool {self.name!r} has no live workers: run the DAG's pool setup task "
                "(or `batchinfer pool up`), or check the connection's worker URLs"
            )
        return self

    def client(self, **kwargs: Any) -> PoolClient:
        discover = self.discover
        if discover is not None:
            kwargs.setdefault("discover", lambda: asyncio.to_thread(discover))
        return PoolClient(self.require().urls, token=self.token, **kwargs)


@dataclass(frozen=True)
class KubernetesRef:
    """Where a Kubernetes pool lives and which credentials reach it."""

    namespace: str
    name: str
    kubernetes_conn_id: str | None = None

    @classmethod
    def parse(cls, worker_pool: str) -> KubernetesRef:
        parts = urlsplit(worker_pool)
        path = [p for p in parts.path.split("/") if p]
        if not parts.netloc or len(path) != 1:
            raise ConfigError(f"{worker_pool!r}: write a Kubernetes pool as kubernetes://NAMESPACE/NAME")
        conn = parse_qs(parts.query).get("kubernetes_conn_id", [None])[0]
        return cls(parts.netloc, path[0], conn)

    def pool(self) -> KubernetesPool:
        from airflow_batchinfer.pools.kubernetes import KubernetesPool, api_client

        if self.kubernetes_conn_id:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

            api = KubernetesHook(conn_id=self.kubernetes_conn_id).get_conn()
        else:
            api = api_client()
        return KubernetesPool(api, self.name, self.namespace)

    def __str__(self) -> str:
        return f"{KUBERNETES}{self.namespace}/{self.name}"


def kubernetes_ref(worker_pool: str) -> KubernetesRef | None:
    """The Kubernetes pool ``worker_pool`` names (a URI or a connection), else ``None``."""
    if worker_pool.startswith(KUBERNETES):
        return KubernetesRef.parse(worker_pool)
    if worker_pool.startswith(LOCAL):
        return None
    return _kubernetes_from_extra(BaseHook.get_connection(worker_pool))


def _kubernetes_from_extra(conn: Any) -> KubernetesRef | None:
    extra = conn.extra_dejson
    if extra.get("backend") != "kubernetes":
        return None
    if not extra.get("pool"):
        raise ConfigError(
            f"connection {conn.conn_id!r}: the kubernetes backend needs extra.pool (and namespace)"
        )
    return KubernetesRef(
        str(extra.get("namespace") or "default"), str(extra["pool"]), extra.get("kubernetes_conn_id")
    )


def _kubernetes(ref: KubernetesRef) -> PoolEndpoints:
    pool = ref.pool()
    return PoolEndpoints(pool.endpoints(), pool.token(), str(ref), discover=pool.endpoints)


def _local(name: str) -> PoolEndpoints:
    pool = LocalPool(name)
    return PoolEndpoints(pool.urls(), pool.token, LOCAL + name)


def _from_connection(conn: Any) -> PoolEndpoints:
    extra = conn.extra_dejson
    ref = _kubernetes_from_extra(conn)
    if ref is not None:
        return _kubernetes(ref)
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
    if worker_pool.startswith(KUBERNETES):
        return _kubernetes(KubernetesRef.parse(worker_pool))
    return _from_connection(BaseHook.get_connection(worker_pool))


async def apool_endpoints(worker_pool: str) -> PoolEndpoints:
    """Worker URLs and token for ``worker_pool`` (in a trigger, on the triggerer's event loop)."""
    if worker_pool.startswith(LOCAL):
        return _local(worker_pool[len(LOCAL) :])
    if worker_pool.startswith(KUBERNETES):
        return await asyncio.to_thread(_kubernetes, KubernetesRef.parse(worker_pool))
    conn = await BaseHook.aget_connection(worker_pool)
    if _kubernetes_from_extra(conn) is not None:  # the Kubernetes API client is synchronous
        return await asyncio.to_thread(_from_connection, conn)
    return _from_connection(conn)


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
