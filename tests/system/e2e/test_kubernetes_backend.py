"""The pipeline DAG on a real Airflow with the Kubernetes backend: the setup task creates and leases
the worker Deployment on a real API server, the kubelet stand-in runs its pods, the shard tasks and
the triggerer find the workers through the API, and the teardown releases the lease."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.state.docs.usage import read_usage
from airflow_batchinfer.state.layout import RunLayout
from tests.support.e2e import conf_for, rows, run
from tests.support.kube_fixture import Kube

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
pytestmark = [pytest.mark.airflow, pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(900)]


def kube_pool(airflow: LocalAirflow, kube: Kube) -> tuple[str, dict[str, Any]]:
    """A namespace of its own, a cncf.kubernetes connection (the provider's hook reads it) and a pool
    connection naming the pool ``e2e`` there; returns the namespace and the run conf that picks
    the pool (``worker_pool``, ``kubernetes``: its Deployment's settings)."""
    ns = kube.namespace()
    airflow.api("POST", "/connections", json={
        "connection_id": f"e2e_kube_{ns}", "conn_type": "kubernetes",
        "extra": json.dumps({"kube_config_path": str(kube.plane.kubeconfig)}),
    })  # fmt: skip
    airflow.api("POST", "/connections", json={
        "connection_id": f"e2e_k8s_pool_{ns}", "conn_type": "batchinfer_pool",
        "extra": json.dumps({"backend": "kubernetes", "namespace": ns, "pool": "e2e",
                             "kubernetes_conn_id": f"e2e_kube_{ns}"}),
    })  # fmt: skip
    settings = {
        "gpus": 1,
        "cpu": "1",
        "memory": "1Gi",
        "port": random.randint(20000, 40000),
        "drain_timeout_s": 5,
    }
    return ns, {"worker_pool": f"e2e_k8s_pool_{ns}", "kubernetes": settings}


def test_a_run_on_a_kubernetes_pool(airflow: LocalAirflow, kube: Kube, e2e_root: Path) -> None:
    from kubernetes import client

    ns, pool = kube_pool(airflow, kube)
    conf, ids = conf_for(e2e_root, "k8s", 60, **pool, idle_ttl_s=0)
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


def test_a_released_gate_scales_the_deployment_to_zero_and_the_answer_scales_it_back(
    airflow: LocalAirflow, kube: Kube, e2e_root: Path
) -> None:
    """Fault: nobody answers the review gate for longer than gate_keep_warm_s (2 s), and the
    pool's reaper (the deployment's CronJob: here KubernetesPool.reconcile() through the same API)
    runs while the gate waits.
    System: the gate gives the run's lease back after 2 s; the reaper finds it lapsed and, with the
    pool's idle_ttl_s 0 and no other lease, scales the Deployment to zero (its pods go). The answer
    takes the lease again (the Deployment back at the run's 2 replicas) and waits, deferred, for new
    pods; round 1 runs on them. The report's usage shows the gate and the re-warm.
    Operator: nothing; the gate's text says the GPUs are given back and what answering costs."""
    from kubernetes import client

    from airflow_batchinfer.pools.kubernetes import KubernetesPool

    ns, pool = kube_pool(airflow, kube)
    keep_warm, replicas = 2, 2
    conf, ids = conf_for(e2e_root, "k8sgate", 30, **pool, idle_ttl_s=0, gate_idle="release",
                         gate_keep_warm_s=keep_warm)  # fmt: skip
    layout = RunLayout(str(Path(conf["output_root"]) / conf["run_name"]))
    apps, core = client.AppsV1Api(kube.api), client.CoreV1Api(kube.api)
    seen: dict[str, Any] = {"replicas_after_answer": []}

    def live_pods() -> list[str]:
        pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/instance=e2e").items
        return [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]

    def review(detail: dict[str, Any]) -> str | None:
        if detail["task_instance"]["task_id"] != "round_01.plan":
            return "Accept remaining as they are"  # the tail's gate: end the run
        opened = [e for e in read_usage(layout) if e.kind == "gate_open" and e.slot == "round-01"]
        if not opened or time.time() < opened[0].at + keep_warm:
            return None  # the lease has not lapsed yet
        seen.setdefault("t0", time.monotonic())
        KubernetesPool(kube.api, "e2e", ns).reconcile()  # as the reaper's CronJob would
        dep = apps.read_namespaced_deployment("e2e", ns)
        pods = live_pods()
        if (dep.spec.replicas or pods) and time.monotonic() - seen["t0"] < 120:
            return None  # pods still going: wait (after 120 s answer anyway; asserted below)
        seen["at_answer"] = (dep.spec.replicas, pods)
        seen["ran_before"] = len(kube.kubelet.ran)
        return "Continue"

    def watch(tis: list[dict[str, Any]]) -> None:
        running = {t["task_id"].split(".")[0] for t in tis if t["state"] == "running"}
        if "at_answer" in seen and "round_01" in running:
            seen["replicas_after_answer"].append(apps.read_namespaced_deployment("e2e", ns).spec.replicas)

    state, root, report, _tis = run(airflow, "e2e_review", conf, on_review=review, on_poll=watch)
    assert state == "success", report
    assert seen.get("at_answer") == (0, []), f"pods kept while the released gate waited: {seen}"
    # round 1 ran on pods the answer started, with the Deployment back at the run's replicas
    started = {name for where, name in kube.kubelet.ran[seen["ran_before"] :] if where == ns}
    round_1 = next(r for r in report["rounds"] if r["round"] == 1)
    workers = {w.rsplit(":", 1)[0] for w in round_1.get("workers", {})}
    assert workers and workers <= started, (workers, started)
    assert replicas in seen["replicas_after_answer"], seen["replicas_after_answer"]
    # every id once
    assert report["invariant"]["ok"], report["invariant"]
    results = rows(root / "results")
    assert sorted(r["id"] for r in results) == sorted(ids)
    # the report's usage: the released gate's wait, and the re-warm the answer waited for
    usage = report["usage"]
    (gate,) = [g for g in usage["gates"] if g["slot"] == "round-01"]
    assert gate["policy"] == "release" and gate["wait_s"] > 0, gate
    assert gate["leased_gpu_s"] < gate["keep_gpu_s"], gate  # the lease's lapse ends what it holds
    (warm,) = [w for w in usage["warms"] if w["slot"] == "round-01"]
    assert warm["seconds"] > 0 and usage["rewarm_s"] >= warm["seconds"], usage
    saved = {k: usage[k] for k in ("idle_gates_gpu_s", "keep_gpu_s", "saved_gpu_s", "rewarm_s")}
    print(f"gate: {gate}; {saved}; re-warm after the answer: {warm['seconds']:.1f} s: {warm['workers']}")
