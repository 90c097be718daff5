"""A Kubernetes pool spec in a test namespace, for the pool manager's component tests."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from airflow_batchinfer.pools.kubernetes import KubernetesPoolSpec


def spec(ns: str, tmp_path: Path, name: str = "pool", **kw: Any) -> KubernetesPoolSpec:
    settings: dict[str, Any] = {
        "name": name, "namespace": ns, "engine": "simulated", "concurrency": 2, "gpus": 1, "cpu": "1",
        "memory": "1Gi", "port": random.randint(20000, 40000), "allowed_prefixes": (str(tmp_path),),
        "drain_timeout_s": 5,
    }  # fmt: skip
    return KubernetesPoolSpec(**{**settings, **kw})
