"""Issue 14, items 1 and 3 on a real Airflow: a trigger whose params reach beyond what the deployment
allows fails at its first tasks, before anything is read, written or started. A security test (its
marker) that lives beside the end-to-end tests to share their Airflow (package-scoped: it stops
after them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.security, pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_trigger_cannot_choose_outside_the_limits(airflow: Any, e2e_root: Path) -> None:
    conf = {
        "input": "/etc/passwd",
        "output_root": str(e2e_root / "runs"),
        "run_name": "attack",
        "worker_pool": "kubernetes://kube-system/x?kubernetes_conn_id=admin_kube",
        "kubernetes": {"image": "evil.example/miner:1", "storage_secret": "prod-db",
                       "env": {"BATCHINFER_WORKER_ALLOW_ANY_PREFIX": "1"}},
    }  # fmt: skip
    run_id = airflow.trigger("e2e_rounds", conf)
    assert airflow.wait_run("e2e_rounds", run_id, timeout_s=300) == "failed"
    states = {t["task_id"]: t["state"] for t in airflow.task_instances("e2e_rounds", run_id)}
    assert states["shard"] == states["pool_setup"] == "failed", states
    log = airflow.task_log("e2e_rounds", run_id, "shard")
    for expected in ("input '/etc/passwd' is outside",
                     "worker_pool 'kubernetes://kube-system/x?kubernetes_conn_id=admin_kube' is not",
                     "kubernetes.image 'evil.example/miner:1' is not allowed",
                     "kubernetes.storage_secret 'prod-db' is not allowed",
                     "kubernetes.env.BATCHINFER_WORKER_ALLOW_ANY_PREFIX is not allowed"):  # fmt: skip
        assert expected in log, log[-3000:]
    assert "Nothing was started or written" in airflow.task_log("e2e_rounds", run_id, "pool_setup")
    # nothing read or written: no run root, so no rejects/ copy of /etc/passwd's lines
    assert not (e2e_root / "runs" / "attack").exists()
