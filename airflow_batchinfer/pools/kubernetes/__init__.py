"""The ``kubernetes`` pool backend: a warm worker Deployment leased and scaled through the API.

The API client is the ``kubernetes`` extra (``pip install 'airflow-batchinfer[kubernetes]'``); the
spec and objects (and the lease rules, ``worker.leases``) import without it, so the CLI parser and
manifests work anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.pools.kubernetes.manager import KubernetesPool, api_client
    from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec

__all__ = [
    "KubernetesPool",
    "KubernetesPoolSpec",
    "api_client",
]
# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "spec": ("KubernetesPoolSpec",),
        "manager": ("KubernetesPool", "api_client"),
    },
)
