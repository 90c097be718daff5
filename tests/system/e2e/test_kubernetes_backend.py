"""The pipeline DAG on a real Airflow with the Kubernetes backend: the setup task creates and leases
the worker Deployment on a real API server, the kubelet stand-in runs its pods, the shard tasks and
the triggerer find the workers through the API, and the teardown releases the lease."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from tests.support.e2e import conf_for, rows, run
from tests.support.kube_fixture import Kube

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
pytestmark = [pytest.mark.airflow, pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_run_on_a_kubernetes_pool(airflow: LocalAirflow, kube: Kube, e2e_root: Path) -> None:
    from kubernetes import client

    ns = kube.namespace()
    # a cncf.kubernetes connection (the provider's hook reads it) and a pool connection naming the pool
    airflow.api("POST", "/connections", json={
        "connection_id": "e2e_kube", "conn_type": "kubernetes",
        "extra": json.dumps({"kube_config_path": str(kube.plane.kubeconfig)}),
    })  # fmt: skip
    airflow.api("POST", "/connections", json={
        "connection_id": "e2e_k8s_pool", "conn_type": "batchinfer_pool",
        "extra": json.dumps({"backend": "kubernetes", "namespace": ns, "pool": "e2e",
                             "kubernetes_conn_id": "e2e_kube"}),
    })  # fmt: skip
    settings = {
        "gpus": 1,
        "cpu": "1",
        "memory": "1Gi",
        "port": random.randint(20000, 40000),
        "drain_timeout_s": 5,
    }
    conf, ids = conf_for(e2e_root, "k8s", 60, worker_pool="e2e_k8s_pool", kubernetes=settings, idle_ttl_s=0)
    state, root, report, tis = run(airflow, "e2e_rounds", conf)
    assert state == "success", report
    assert report["invariant"]["ok"], report["invariant"]
    approved = rows(root / "results")
    assert len({r["id"] for r in approved}) == len(approved) == report["approved"]
    assert report["approved"] + report["remaining_pending"] == len(ids)
    # the jobs ran on the Deployment's two pods (workers are named pod:port), and both took some
    workers = {w.rsplit(":", 1)[0] for r in report["rounds"] for w in r.get("workers", {})}
    pods = {name for where, name in kube.kubelet.ran if where == ns}
    assert len(workers) == 2 and workers <= pods, (workers, pods)
    # setup created the Deployment and held a lease for this run; teardown released it and, with
    # idle_ttl_s=0, scaled the pool to zero
    dep = client.AppsV1Api(kube.api).read_namespaced_deployment("e2e", ns)
    assert dep.spec.replicas == 0 and json.loads(dep.metadata.annotations["batchinfer.io/leases"]) == {}
    setup = next(t for t in tis if t["task_id"] == "pool_setup")
    assert setup["state"] == "success"
