"""A parsed ``worker_pool`` reference opened as the backend it names: local, static or Kubernetes.

Above the backends, which import the reference (:mod:`airflow_batchinfer.pools.ref`), never this.
The Kubernetes backend needs the ``kubernetes`` extra, so it is imported only to open such a pool.
Connections and Kubernetes credentials come from the caller (``airflow_batchinfer.hooks.pool`` on
the Airflow side), so nothing here imports Airflow.
"""

from __future__ import annotations

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.local import LocalPool
from airflow_batchinfer.pools.ref import ConnectionLike, KubernetesApi, PoolRef, WorkerPool
from airflow_batchinfer.pools.static import StaticPool


def open_backend(
    ref: PoolRef, connection: ConnectionLike | None = None, *, kubernetes_api: KubernetesApi | None = None
) -> WorkerPool:
    """The pool ``ref`` names. ``connection``: the Airflow connection a connection reference names.
    ``kubernetes_api``: makes the API client for a ``kubernetes_conn_id`` (Airflow's hook)."""
    resolved = ref.resolve(connection)
    if resolved.backend == "local":
        return LocalPool(resolved.name)
    if resolved.backend == "kubernetes":
        from airflow_batchinfer.pools.kubernetes.manager import KubernetesPool, api_client

        if resolved.kubernetes_conn_id and kubernetes_api is None:
            raise ConfigError(
                f"{resolved}: a kubernetes_conn_id needs Airflow's cncf.kubernetes provider "
                "(pip install 'airflow-batchinfer[cncf]')"
            )
        api = kubernetes_api(resolved.kubernetes_conn_id) if kubernetes_api else api_client()
        return KubernetesPool(api, resolved.name, resolved.namespace or "default", peers=resolved.peers)
    assert connection is not None
    urls = [u.strip() for u in (connection.host or "").split(",") if u.strip()]
    return StaticPool(urls=urls, rpc_token=connection.password or None, name=ref.name)
