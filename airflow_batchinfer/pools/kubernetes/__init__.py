"""The ``kubernetes`` pool backend: a warm worker Deployment leased and scaled through the API.

The API client is the ``kubernetes`` extra (``pip install 'airflow-batchinfer[kubernetes]'``); the
spec and objects (and the lease rules, ``worker.leases``) import without it, so the CLI parser and
manifests work anywhere.
"""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec

__all__ = ["KubernetesPool", "KubernetesPoolSpec", "api_client"]


def __getattr__(name: str) -> Any:
    if name in ("KubernetesPool", "api_client"):
        from airflow_batchinfer.pools.kubernetes import manager

        return getattr(manager, name)
    raise AttributeError(name)
